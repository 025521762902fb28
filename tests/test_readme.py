"""The README's example runs as printed (shrunk only in sequence length, to keep CI fast)."""
import pathlib
import re


def test_readme_listing2_runs():
    text = (pathlib.Path(__file__).parents[1] / "README.md").read_text()
    block = re.search(r"## Use it.*?```python\n(.*?)```", text, re.S).group(1)
    assert "causal_linear_decoder(B, C, V, is_mask_weight=True, gamma=gamma)" in block
    code = block.replace("seqlen, rank = 1, 32, 4096, 128", "seqlen, rank = 1, 32, 300, 128")
    code = code.replace("4096, 256", "300, 256")
    namespace = {}
    exec(compile(code, "README.md", "exec"), namespace)
    assert tuple(namespace["output"].shape) == (1, 32, 300, 256)

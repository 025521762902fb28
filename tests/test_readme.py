"""Every Python block of the README runs as printed on the CPU (Listing 2 shrunk only in sequence
length); a block whose first line says it needs GPUs is compiled, not run."""
import pathlib
import re

import pytest

from conftest import quick_lane

README = (pathlib.Path(__file__).parents[1] / "README.md").read_text(encoding="utf-8")
BLOCKS = re.findall(r"```python\n(.*?)```", README, re.S)


def test_readme_has_its_python_blocks():
    assert len(BLOCKS) >= 5
    assert "causal_linear_decoder(B, C, V, is_mask_weight=True, gamma=gamma)" in BLOCKS[0]


# the quick lane runs the first block (the paper's Listing 1 call); the full lane every block
@pytest.mark.parametrize("index", quick_lane(range(len(BLOCKS))))
def test_readme_block_runs(index, capsys):
    code = BLOCKS[index]
    if code.splitlines()[0].startswith("# needs GPU"):
        compile(code, f"README.md block {index}", "exec")  # torchrun on GPUs: `make bench-sp` runs it
        return
    # Listing 2 at the paper's length would take a while on a CPU: the same code, 300 rows
    code = code.replace("seqlen, rank = 1, 32, 4096, 128", "seqlen, rank = 1, 32, 300, 128")
    compiled = compile(code, f"README.md block {index}", "exec")
    namespace = {"__name__": f"readme_block_{index}"}
    exec(compiled, namespace)
    printed = capsys.readouterr().out
    for claim in re.findall(r"#\s*(True|torch\.Size\(\[[0-9, ]+\]\))\s*$", code, re.M):
        if "4096" not in claim:
            assert claim in printed, (claim, printed)
    if index == 0:
        assert tuple(namespace["output"].shape) == (1, 32, 300, 256)

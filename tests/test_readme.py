"""The README's Python examples run as written, and its first two commands are the CI commands."""
import re
from pathlib import Path

ROOT = Path(__file__).parent.parent
README = (ROOT / "README.md").read_text()


def test_python_examples_run(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("TCPY_CACHE_DIR", str(tmp_path))  # autotune records its winner there
    blocks = re.findall(r"```python\n(.*?)```", README, re.S)
    assert len(blocks) >= 2
    namespace: dict = {}
    for block in blocks:  # later blocks use names the earlier ones defined
        exec(compile(block, "README.md", "exec"), namespace)
    out = capsys.readouterr().out
    assert "def 'matmul': size K is 32 from A.shape[1] but B.shape[0] is 31" in out
    assert "cannot infer the range of index variable 'j'" in out
    assert "C: (M, N) = (64, 48)" in out
    assert (tmp_path / "tuned.json").is_file()


def test_readme_test_command_is_what_ci_runs():
    commands = re.findall(r"```bash\n(.*?)\n```", README, re.S)
    ci = [line for line in (ROOT / ".ci" / "run").read_text().splitlines() if "pytest" in line]
    assert commands[1] == ci[0]  # (a second pass may follow: the same tests under a preset target)
    assert commands[0].endswith("&& python -m tcpy demo")

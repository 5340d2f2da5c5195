"""The notebooks in notebooks/ execute without error, draw their plots, and are committed stripped.

Each notebook runs top to bottom in a fresh Jupyter kernel (nbclient, which nbmake also uses), so
`python -m pytest -q` (what CI runs) keeps them from rotting. `python -m pytest --nbmake
notebooks` runs them the nbmake way.
"""
from pathlib import Path

import nbformat
import pytest

nbclient = pytest.importorskip("nbclient", reason="the notebook tests need the [test] extra")

NOTEBOOKS = Path(__file__).parent.parent / "notebooks"
# notebook -> how many pictures it must draw
PLOTS = {"01_quickstart.ipynb": 0, "02_range_inference.ipynb": 3, "03_kernels.ipynb": 1, "04_gradients.ipynb": 0,
         "05_tiny_ir.ipynb": 0,
         "06_ptir_ops.ipynb": 0,
         "07_dask.ipynb": 0,
         "08_size_sweep.ipynb": 1}


def test_every_notebook_is_listed():
    assert sorted(p.name for p in NOTEBOOKS.glob("*.ipynb")) == sorted(PLOTS)


@pytest.mark.parametrize("name", sorted(PLOTS))
def test_committed_without_outputs(name):
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, f"{name}: strip the outputs"


@pytest.mark.parametrize("name", sorted(PLOTS))
def test_notebook_executes_and_plots(name, monkeypatch):
    monkeypatch.setenv("MPLBACKEND", "Agg")  # no display here; %matplotlib inline still renders PNGs
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=300, kernel_name="python3",
                                     resources={"metadata": {"path": str(NOTEBOOKS)}})
    client.execute()  # raises CellExecutionError, with the cell and traceback, on any error
    outputs = [o for cell in nb.cells if cell.cell_type == "code" for o in cell.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    images = [o for o in outputs if o.output_type == "display_data" and "image/png" in o.get("data", {})]
    assert len(images) >= PLOTS[name]

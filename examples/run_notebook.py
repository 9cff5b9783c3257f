"""Execute examples/whatif.ipynb top to bottom and save it with its outputs (so it shows them
when opened on the web). Run from anywhere: ``python examples/run_notebook.py``."""

from __future__ import annotations

from pathlib import Path

import nbclient
import nbformat

NOTEBOOK = Path(__file__).resolve().parent / "whatif.ipynb"


def main() -> None:
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                            resources={"metadata": {"path": str(NOTEBOOK.parent)}}).execute()
    for cell in nb.cells:  # keep diffs small: no volatile execution metadata
        cell.metadata.pop("execution", None)
    nbformat.write(nb, NOTEBOOK)
    print(f"wrote {NOTEBOOK} with outputs")


if __name__ == "__main__":
    main()

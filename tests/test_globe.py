"""density_3d.png (pyvista, in a child process) and the caption and panels of edi.png.

- The 3-D picture (``view DIR --3d``, the same function as at the end of a run) of a run
  whose density has three clusters (north pole, +x, -x) on an icosphere of level 3:
  written, not blank, each cluster bright in the views that face it and dark in those that
  do not (pixel counts per view); skipped, with the reason, only where pyvista or an OpenGL
  library (EGL, or an X display) is missing. A renderer that cannot finish in time gives a
  one-line reason instead of an exception, and a mesh that is not S^2 is a ValueError.
- edi.png: the caption states the measured relative residual and the residual expected of
  the scheme and the weights (read from the run's title, or from the rows); the third panel
  names the maximal-slope quantities that are 0 instead of leaving them out silently.

Pictures are drawn on rank 0 of a run, so these tests run serially.
"""

from __future__ import annotations

import ctypes.util
import importlib.util
import os

import dolfinx_solver  # noqa: F401
from mpi4py import MPI

import numpy as np
import pytest
from PIL import Image

from drivers.engine.io._budget_caption import budget_caption, budget_context
from drivers.engine.io._globe import GLOBE_VIEWS, density_3d
from drivers.engine.io._plots import plot_budget
from meshes.sphere import icosphere_arrays

pytestmark = [
    pytest.mark.skipif(MPI.COMM_WORLD.size > 1, reason="rank-0 pictures: tested serially"),
    pytest.mark.filterwarnings("error::UserWarning"),
]

CLUSTERS = np.array([[0.0, 0.0, 1.0], [1.0, 0.0, 0.0], [-1.0, 0.0, 0.0]])


def _three_clusters(level: int = 3) -> tuple[np.ndarray, np.ndarray]:
    x, cells = icosphere_arrays(level)
    vertices = x[cells]
    centres = vertices.mean(axis=1)
    centres /= np.linalg.norm(centres, axis=1)[:, None]
    density = sum(np.exp(25.0 * (centres @ c - 1.0)) for c in CLUSTERS) + 1e-3
    return vertices, density


def _cannot_render() -> str | None:
    if importlib.util.find_spec("pyvista") is None:
        return "pyvista is not installed"
    if not os.environ.get("DISPLAY") and ctypes.util.find_library("EGL") is None:
        return "no X display and no EGL library (apt-get install libegl1 libegl-mesa0)"
    return None


def test_density_3d_never_raises_for_the_renderer(tmp_path):
    vertices, density = _three_clusters(level=1)
    why = density_3d(tmp_path / "x.png", vertices, density, timeout=0.01)
    assert isinstance(why, str) and "did not finish" in why
    assert not (tmp_path / "x.png").exists()
    with pytest.raises(ValueError, match="triangles"):
        density_3d(tmp_path / "y.png", vertices[:, :2], density)


def _rows(dynamics: str, defect: float = 0.0) -> list[dict[str, float]]:
    rows = []
    for t in np.linspace(0.0, 2.0, 11):
        rows.append(
            {
                "t": t,
                "dE": 4.0 * t,
                "int_dtE": 0.0 if dynamics == "frozen" else np.sin(t),
                "int_dtE_drift": 0.0,
                "ito_correction": 0.0,
                "martingale": 0.1 * t if dynamics == "ou" else 0.0,
                "dtE_remainder": 0.0,
                "int_G2": 3.9 * t,
                "int_dissipation": 3.9 * t,
                "int_diffusion": 0.0,
                "edi_residual": 0.1 * t,
                "G2": 1.0 + t,
                "slope2": 1.0 + t,
                "slope_defect": defect,
                "uphill_mass": defect,
            }
        )
    return rows


def test_budget_caption_says_what_is_expected():
    rows = _rows("frozen")
    assert budget_context("energy budget: jko, 3 head(s), ou weights", rows) == ("jko", "ou", 3)
    assert budget_context("my own title", _rows("ou")) == (None, "ou", None)
    assert budget_context("", _rows("oscillating")) == (None, "time-dependent", None)
    assert budget_context("", rows) == (None, "frozen", None)
    # residual 0.2 at t = 2 against the largest term dE = 8: 2.5 %
    text = budget_caption(rows, "fv", "frozen", 1)
    assert "Residual at t = 2: 0.2 = 2.5 % of the largest term (8)" in text
    assert "O(h^2)" in text and "0.2 apart" in text and "pure discretisation error" in text
    assert "O(tau)" in budget_caption(rows, "jko", "frozen", 1)
    assert budget_caption([]) == "No budget rows."
    assert "O(dt^2) for RK4" in budget_caption(rows, "particles", "frozen", 3)
    ou = budget_caption(_rows("ou"), "fv", "ou", 3)
    assert "sigma^2" in ou and "pure discretisation" not in ou
    assert "move fast" in budget_caption(_rows("oscillating"), "fv", "oscillating", 3)


def test_edi_png_caption_and_third_panel(tmp_path, monkeypatch):
    title = "energy budget: fv, 1 head(s), frozen weights"
    fig = plot_budget(tmp_path / "one.png", _rows("frozen"), title=title)
    assert (tmp_path / "one.png").is_file()
    (caption,) = [t.get_text() for t in fig.texts]
    assert caption.replace("\n", " ") == budget_caption(_rows("frozen"), "fv", "frozen", 1)
    third = fig.axes[2]
    assert len(third.lines) == 2  # G^2 and slope^2; the defect and uphill mass are 0 ...
    notes = [t.get_text() for t in third.texts]
    assert notes == ["defect and uphill mass = 0 at every output (gradient flow), not drawn"]
    # several heads: all four drawn, nothing to note (the figure only: no PNG this time)
    import matplotlib.figure

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", lambda *args, **kwargs: None)
    fig = plot_budget(tmp_path / "three.png", _rows("oscillating", defect=0.01), title=title)
    assert len(fig.axes[2].lines) == 4 and not fig.axes[2].texts


def test_view_3d_shows_every_cluster(tmp_path, capsys, monkeypatch):
    """``transformer-pde view DIR --3d`` on a run (drawn without pictures) whose density has
    three clusters (north pole, +x, -x): density_3d.png is written, not blank, and each
    cluster is bright in the views that face it (pixel counts per view); a .gif asked for
    is a one-line error (exit 2). DIR is relative to the working directory (the renderer runs
    in a child process with another one)."""
    from drivers.engine import main as cli_main

    bumps = " + ".join(f"exp(25 * ({x} - 1))" for x in ("x[2]", "x[0]", "-x[0]"))
    config = tmp_path / "s2.toml"
    config.write_text(
        f'[mesh]\nmanifold = "S2"\nrefinement = 3\n[initial]\ndensity = "{bumps} + 1e-3"\n'
        "[time]\nt_end = 0.01\ndt = 0.01\n[output]\nedi = false\n"
    )
    monkeypatch.chdir(tmp_path)
    assert cli_main(["run", str(config), "--quiet", "--no-pictures", "--out", "run"]) == 0
    assert cli_main(["view", "run", "--3d", "--out", str(tmp_path / "x.gif")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "the 3-D view is a .png file" in err
    reason = _cannot_render()
    if reason:
        pytest.skip(reason)
    assert cli_main(["view", "run", "--3d"]) == 0
    rgb = np.asarray(
        Image.open(tmp_path / "run" / "density_3d.png").convert("RGB"), dtype=np.float64
    )
    assert rgb.mean(axis=-1).std() > 20.0  # not blank
    h, w = rgb.shape[0] // 2, rgb.shape[1] // 2
    views = [rgb[:h, :w], rgb[:h, w:], rgb[h:, :w], rgb[h:, w:]]  # lon 0, 90, 180, 270
    assert [lon for lon, _ in GLOBE_VIEWS] == [0.0, 90.0, 180.0, 270.0]

    def bright(view: np.ndarray) -> int:  # viridis' top: yellow (high red and green)
        return int(np.sum((view[..., 0] > 180) & (view[..., 1] > 180) & (view[..., 2] < 120)))

    counts = [bright(v) for v in views]
    # +x faces lon 0 and -x lon 180, each seen whole; lon 90 and 270 see both on the limb
    # and the north pole at the top, as every view does
    assert counts[0] > 1.5 * counts[1] and counts[0] > 1.5 * counts[3], counts
    assert counts[2] > 1.5 * counts[1] and counts[2] > 1.5 * counts[3], counts
    assert min(counts) > 0, counts  # the pole cluster is in every view

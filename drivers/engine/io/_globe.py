"""``density_3d.png``: an S^2 density as a shaded globe, four views, rendered by pyvista (VTK).

density.png (two hemispheres) and density_map.png (an equal-area map) are matplotlib; this is
the 3-D view: the cells of the mesh as a pyvista ``PolyData`` built from numpy arrays (never
from our XDMF files: VTK's XDMF reader segfaults on DOLFINx function files),
coloured by the density on the scale of the other pictures
(:func:`drivers.engine.io._pictures.choose_scale`, viridis, log beyond three decades), lit, with

- four orthographic views from latitude 20 degrees north, at longitudes 0, 90, 180 and 270
  degrees, so that every cluster is seen (nearly) face on in one of them;
- the equator and the meridians of longitude 0 and 90 degrees as thin lines, the poles
  marked N and S, the axes x, y, z as short arrows out of the sphere;
- the clusters (centres and masses, as on density_map.png) numbered by decreasing mass.

Rendering needs OpenGL: off-screen through Mesa EGL (Debian ``libegl1 libegl-mesa0
libgl1-mesa-dri``, which docker/install.sh installs), or an X display. VTK can crash the
process where neither works, so the picture is drawn in a child process
(``python -m drivers.engine.io._globe DATA.npz OUT.png``) under a time limit: whatever happens
there, the run goes on, and :func:`density_3d` returns a one-line reason instead of a picture
(the run prints it as a note). A picture whose pixels are all (nearly) one colour counts as a
failure too. Rank 0 only.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["GLOBE_SWITCH", "GLOBE_VIEWS", "RENDER_TIMEOUT", "density_3d", "render_globe"]

Array = npt.NDArray[np.float64]

#: (longitude, latitude) in degrees of the four viewers
GLOBE_VIEWS = ((0.0, 20.0), (90.0, 20.0), (180.0, 20.0), (270.0, 20.0))
#: seconds the child process may take (start-up, import of pyvista, rendering)
RENDER_TIMEOUT = 120.0
#: pixels of one view (the picture is 2 x 2 views, plus the colour bar)
VIEW_PIXELS = 420
#: a picture whose grey levels have a smaller standard deviation is blank
BLANK_STD = 4.0


#: The environment variable that switches density_3d.png off in runs (value "0"): a machine
#: where VTK cannot render, or many small runs (a render costs a child process, about 1.5 s).
GLOBE_SWITCH = "TRANSFORMER_PDE_3D"


def density_3d(
    path: str | Path,
    vertices: Array,
    density: Array,
    t: float | None = None,
    clusters: tuple[Array, Array] | None = None,
    timeout: float = RENDER_TIMEOUT,
) -> str | None:
    """density_3d.png of an S^2 density (module docstring), drawn in a child process.

    Args:
        path: the PNG file.
        vertices: (n, 3, 3) the cells' vertices on the unit sphere.
        density: (n,) the cell values.
        t: the time, for the title.
        clusters: centres (k, 3) and masses (k,) to number; None: none.
        timeout: seconds before the child is stopped.

    Returns:
        None when the picture was written; else why not, in one line (pyvista or OpenGL
        missing, the child crashed or timed out, the picture was blank). Never raises for
        a rendering problem.

    Raises:
        ValueError: the arrays are not an S^2 mesh and its cell values.
    """
    from drivers.engine.io._pictures import choose_scale

    vertices = np.asarray(vertices, dtype=np.float64)
    density = np.asarray(density, dtype=np.float64).reshape(-1)
    if vertices.ndim != 3 or vertices.shape[1:] != (3, 3) or len(vertices) != len(density):
        raise ValueError(
            f"density_3d needs (n, 3, 3) triangles and n values, got {vertices.shape} and "
            f"{density.shape}"
        )
    scale = choose_scale(density)
    centres, masses = clusters if clusters is not None else (np.zeros((0, 3)), np.zeros(0))
    path = Path(path)
    env = dict(os.environ)
    if not env.get("DISPLAY"):  # straight to EGL, without VTK's warning about X
        env.setdefault("VTK_DEFAULT_OPENGL_WINDOW", "vtkEGLRenderWindow")
    with tempfile.TemporaryDirectory(prefix="globe-") as tmp:
        data = Path(tmp) / "globe.npz"
        np.savez(
            data,
            vertices=vertices,
            density=density,
            scale=np.array([scale.lo, scale.hi, float(scale.log)]),
            t=np.array(np.nan if t is None else float(t)),
            centres=np.asarray(centres, dtype=np.float64).reshape(-1, 3),
            masses=np.asarray(masses, dtype=np.float64).reshape(-1),
        )
        try:
            proc = subprocess.run(
                [sys.executable, "-m", "drivers.engine.io._globe", str(data), str(path.resolve())],
                cwd=Path(__file__).resolve().parents[3],
                env=env,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=timeout,
            )
        except subprocess.TimeoutExpired:
            return f"pyvista did not finish in {timeout:g} s"
        except OSError as exc:
            return f"cannot start the renderer: {exc}"
    if proc.returncode != 0:
        lines = [x for x in (proc.stderr or "").splitlines() if x.strip()]
        why = lines[-1].strip() if lines else f"exit code {proc.returncode}"
        if proc.returncode < 0:
            why = f"the renderer crashed (signal {-proc.returncode})"
        return why[:200]
    return None


def _lines(pv: Any) -> list[Any]:
    """The equator and the meridians of longitude 0 and 90 degrees, just above the sphere."""
    s = np.linspace(0.0, 2.0 * np.pi, 181)
    r = 1.004
    circles = [
        np.column_stack([np.cos(s), np.sin(s), 0 * s]),  # equator
        np.column_stack([np.cos(s), 0 * s, np.sin(s)]),  # longitude 0 / 180
        np.column_stack([0 * s, np.cos(s), np.sin(s)]),  # longitude 90 / 270
    ]
    return [pv.lines_from_points(r * c) for c in circles]


def render_globe(data: str | Path, out: str | Path) -> None:
    """Draw density_3d.png from the arrays that :func:`density_3d` saved (in the child).

    Raises:
        RuntimeError: the picture is blank (no OpenGL context gave pixels).
    """
    import pyvista as pv

    pv.OFF_SCREEN = True
    arrays = np.load(data)
    vertices, density = arrays["vertices"], arrays["density"]
    lo, hi, log = (float(v) for v in arrays["scale"])
    t = float(arrays["t"])
    centres, masses = arrays["centres"], arrays["masses"]
    n = len(vertices)
    faces = np.column_stack([np.full(n, 3), np.arange(3 * n).reshape(n, 3)]).ravel()
    mesh = pv.PolyData(vertices.reshape(-1, 3), faces)
    if log:  # colours of log10(density) on [log10 lo, log10 hi]: the bar's labels say so
        mesh.cell_data["density"] = np.log10(np.maximum(density, lo))
        lo, hi = np.log10(lo), np.log10(hi)
    else:
        mesh.cell_data["density"] = density
    lines = _lines(pv)
    order = np.argsort(-masses, kind="stable")
    plotter = pv.Plotter(
        off_screen=True, shape=(2, 2), window_size=(2 * VIEW_PIXELS, 2 * VIEW_PIXELS + 60)
    )
    plotter.set_background("white")
    for k, (lon, lat) in enumerate(GLOBE_VIEWS):
        plotter.subplot(k // 2, k % 2)
        actor = plotter.add_mesh(
            mesh,
            scalars="density",
            cmap="viridis",
            clim=(lo, hi),
            show_scalar_bar=False,
            smooth_shading=False,
            ambient=0.35,
            diffuse=0.75,
        )
        for line in lines:
            plotter.add_mesh(line, color="white", line_width=1.2, opacity=0.7)
        for axis in range(3):
            tip = np.zeros(3)
            tip[axis] = 1.35
            base = np.zeros(3)
            base[axis] = 1.0
            arrow = pv.Arrow(base, tip - base, tip_length=0.25, shaft_radius=0.02, scale=0.35)
            plotter.add_mesh(arrow, color=("#c0392b", "#27ae60", "#2c3e80")[axis])
        lam, phi = np.radians(lon), np.radians(lat)
        eye = np.array([np.cos(phi) * np.cos(lam), np.cos(phi) * np.sin(lam), np.sin(phi)])
        # labels of what faces the viewer (drawn over everything, so the far side is left out)
        marks = np.array([[0, 0, 1.1], [0, 0, -1.1], [1.45, 0, 0], [0, 1.45, 0], [0, 0, 1.45]])
        names = np.array(["N", "S", "x", "y", "z"])
        seen = marks @ eye > -0.05
        seen[2:] = np.abs(marks[2:] @ eye) < 1.2  # an axis end on the limb, not end-on
        plotter.add_point_labels(
            marks[seen],
            list(names[seen]),
            font_size=14,
            text_color="black",
            shape_opacity=0.0,
            show_points=False,
            always_visible=True,
        )
        front = order[centres[order] @ eye > 0.15] if len(order) else order
        if len(front):
            plotter.add_point_labels(
                1.02 * centres[front],
                [f"{int(np.flatnonzero(order == i)[0]) + 1}" for i in front],
                font_size=15,
                text_color="red",
                point_color="red",
                point_size=9,
                render_points_as_spheres=True,
                shape_opacity=0.0,
                always_visible=True,
            )
        eye = 5.0 * eye
        plotter.camera_position = [tuple(eye), (0.0, 0.0, 0.0), (0.0, 0.0, 1.0)]
        plotter.enable_parallel_projection()
        plotter.camera.parallel_scale = 1.55
        plotter.add_text(f"from lon {lon:g}, lat {lat:g}", font_size=9, color="black")
    plotter.subplot(1, 1)
    plotter.add_scalar_bar(
        "log10 density" if log else "density",
        mapper=actor.mapper,
        color="black",
        vertical=False,
        position_x=0.2,
        position_y=0.02,
        width=0.6,
        height=0.07,
        fmt="%.2g",
    )
    plotter.subplot(0, 0)
    when = "" if np.isnan(t) else f", t = {t:.3g}"
    plotter.add_text(f"density{when}", position="upper_right", font_size=11, color="black")
    image = plotter.screenshot(str(out), return_img=True)
    plotter.close()
    if float(np.asarray(image, dtype=np.float64).mean(axis=-1).std()) < BLANK_STD:
        Path(out).unlink(missing_ok=True)
        raise RuntimeError("the 3-D picture came out blank (no working OpenGL context)")


def _main(argv: list[str]) -> int:
    """The child process: ``python -m drivers.engine.io._globe DATA.npz OUT.png``."""
    if len(argv) != 2:
        print("usage: python -m drivers.engine.io._globe DATA.npz OUT.png", file=sys.stderr)
        return 2
    try:
        render_globe(argv[0], argv[1])
    except ImportError as exc:
        print(f"pyvista is not importable: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:  # one line for the parent's note
        print(f"{type(exc).__name__}: {exc}".replace("\n", " "), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))

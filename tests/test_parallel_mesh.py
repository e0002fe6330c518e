"""Sphere meshes built in parallel equal the serial meshes (issue 32, item 1).

``icosphere`` / ``circle`` build every rank's block of cells and nodes from the global index
alone (:mod:`meshes._sphere_blocks`). The reference is independent of that code:
``icosphere_arrays`` / ``circle_arrays`` (the recursive refinement, the whole mesh on one
process) and the control-volume geometry of the mesh built on ``COMM_SELF``. Compared by
original (global) cell index: the vertex coordinates of every cell in order, areas, centres,
and every facet (its two cells, length, normal, midpoint), all bitwise.
"""

from __future__ import annotations

import os
import subprocess
import sys

import dolfinx_solver  # noqa: F401
from mpi4py import MPI

import numpy as np
import pytest

from meshes import circle, control_volumes, icosphere
from meshes._sphere_blocks import (
    circle_cell_block,
    circle_node_block,
    icosphere_cell_block,
    icosphere_node_block,
    icosphere_num_nodes,
)
from meshes.sphere import circle_arrays, icosphere_arrays, rank_block
from tests.conftest import ROOT, VENV_BIN, cli_env


def _in_pieces(block, level, total, pieces, rng):
    """``block(level, a, b)`` over random consecutive ranges covering 0..total, concatenated."""
    cuts = [0, *np.sort(rng.integers(0, total + 1, pieces - 1)), total]
    return np.concatenate([block(level, a, b) for a, b in zip(cuts[:-1], cuts[1:], strict=True)])


@pytest.mark.parametrize("level", [0, 1, 2, 3, 4, 5])
def test_blocks_reproduce_icosphere_arrays(level):
    """Any split of the cells and nodes into blocks gives icosphere_arrays bitwise."""
    x, f = icosphere_arrays(level)
    nv = icosphere_num_nodes(level)
    assert nv == len(x)
    rng = np.random.default_rng(level)
    for pieces in (1, 3, 7):
        cb = _in_pieces(icosphere_cell_block, level, len(f), pieces, rng)
        xb = _in_pieces(icosphere_node_block, level, nv, pieces, rng)
        assert np.array_equal(xb[cb], x[f])  # same cells, same vertex order, same coordinates
        assert np.array_equal(np.unique(cb), np.arange(nv))  # every node used, ids distinct
    with pytest.raises(ValueError, match="not within"):
        icosphere_cell_block(level, 0, len(f) + 1)


def test_circle_blocks_reproduce_circle_arrays():
    for r in (0, 3):
        x, c = circle_arrays(r)
        n = len(c)
        cb = np.concatenate([circle_cell_block(r, 0, 5), circle_cell_block(r, 5, n)])
        xb = np.concatenate([circle_node_block(r, 0, 7), circle_node_block(r, 7, n)])
        assert np.array_equal(cb, c) and np.array_equal(xb, x)


def _by_original(comm, cv):
    """Owned-cell data and facets of a distributed mesh, gathered and sorted by global index."""
    n = cv.n_owned
    idx = np.concatenate(comm.allgather(cv.original_index[:n]))
    order = np.argsort(idx, kind="stable")
    cells = {
        k: np.concatenate(comm.allgather(getattr(cv, k)[:n]))[order]
        for k in ("vertices", "centres", "measures")
    }
    cells["index"] = idx[order]
    pair = cv.original_index[cv.facet_cells]
    fdata = np.column_stack([pair, cv.facet_measure, cv.facet_normal, cv.facet_midpoint])
    fdata = np.concatenate(comm.allgather(fdata))
    fdata = np.unique(fdata, axis=0)  # a facet between two ranks is listed by both
    return cells, fdata


def check_against_serial(comm) -> list[str]:
    """Differences between the meshes built on ``comm`` and the serial references (none)."""
    bad = []
    for level in (0, 1, 2, 3):
        x, f = icosphere_arrays(level)
        par, pfacets = _by_original(comm, control_volumes(icosphere(comm, level)))
        ser, sfacets = _by_original(MPI.COMM_SELF, control_volumes(icosphere(MPI.COMM_SELF, level)))
        if not np.array_equal(par["index"], np.arange(len(f))):
            bad.append(f"S2 level {level}: original indices are not 0..N-1")
            continue
        if not np.array_equal(par["vertices"], x[f]):
            bad.append(f"S2 level {level}: cell vertices differ from icosphere_arrays")
        for key in ("vertices", "centres", "measures"):
            if not np.array_equal(par[key], ser[key]):
                bad.append(f"S2 level {level}: {key} differ from the serial mesh")
        if pfacets.shape != (30 * 4**level, 9) or not np.array_equal(pfacets, sfacets):
            bad.append(f"S2 level {level}: facets differ from the serial mesh")
    for r in (0, 2):
        x, c = circle_arrays(r)
        par, pfacets = _by_original(comm, control_volumes(circle(comm, r)))
        ser, sfacets = _by_original(MPI.COMM_SELF, control_volumes(circle(MPI.COMM_SELF, r)))
        if not np.array_equal(par["vertices"], x[c]):
            bad.append(f"S1 refinement {r}: cell vertices differ from circle_arrays")
        if not (
            np.array_equal(par["measures"], ser["measures"]) and np.array_equal(pfacets, sfacets)
        ):
            bad.append(f"S1 refinement {r}: measures or facets differ from the serial mesh")
    return bad


def test_parallel_mesh_equals_serial(comm):
    """On this communicator (1 or 2 ranks): the same cells, areas, centres, facets, order."""
    bad = check_against_serial(comm)
    assert comm.allgather(bad) == [bad] * comm.size  # the same verdict on every rank
    assert bad == []


def test_no_rank_builds_the_whole_mesh(comm):
    """Each rank's input block is its share (within one cell/node) of the global mesh."""
    level = 3
    n_cells, n_nodes = 20 * 4**level, icosphere_num_nodes(level)
    starts = comm.allgather(rank_block(comm, n_cells)) + comm.allgather(rank_block(comm, n_nodes))
    sizes = [b - a for a, b in starts]
    assert max(sizes[: comm.size]) - min(sizes[: comm.size]) <= 1
    assert sum(sizes[: comm.size]) == n_cells and sum(sizes[comm.size :]) == n_nodes
    assert max(sizes[: comm.size]) <= -(-n_cells // comm.size)


@pytest.mark.serial
def test_parallel_mesh_equals_serial_on_three_ranks():
    """``mpiexec -n 3``: the blocks of three ranks give the serial meshes too."""
    code = (
        "from mpi4py import MPI\n"
        "from tests.test_parallel_mesh import check_against_serial\n"
        "bad = check_against_serial(MPI.COMM_WORLD)\n"
        "every = MPI.COMM_WORLD.gather(bad, root=0)\n"
        "if MPI.COMM_WORLD.rank == 0:\n"
        "    print('RESULT', every, flush=True)\n"
    )
    env = cli_env()
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    cmd = [str(VENV_BIN / "mpiexec"), "-n", "3", sys.executable, "-c", code]
    try:
        out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        pytest.fail("mpiexec -n 3 did not end in 120 s")
    assert out.returncode == 0, out.stderr[-2000:]
    assert "RESULT [[], [], []]" in out.stdout.splitlines(), out.stdout

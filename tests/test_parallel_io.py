"""Outputs and checkpoints without a rank-0 gather (issue 32, item 2).

- blocks: owned rows to contiguous blocks of the global order and back, against numpy;
- density.h5 written collectively (MPI-IO rows into datasets h5py created) equals the mesh
  arrays of the icosphere and the values by original cell index, on any number of ranks;
- final.npz / checkpoints streamed through rank 0 one chunk at a time: ``np.load`` reads the
  same arrays as from ``np.savez``, the checkpoint digest is the serial one, and rank 0's
  peak allocation while writing stays far below the array (tracemalloc);
- a checkpoint written on N ranks restores on M (2 -> 1 and 1 -> 2 under ``mpiexec -n 2``):
  every cell gets its own saved values, bit for bit.
"""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import dolfinx_solver  # noqa: F401
from mpi4py import MPI

import h5py
import numpy as np
import pytest

from drivers.engine import DensityWriter
from drivers.engine._checkpoint import (
    _digest,
    load_latest_checkpoint,
    restore_cells,
    save_checkpoint_collective,
)
from drivers.engine.io import _npz_stream as npz_stream
from drivers.engine.io._blocks import BlockLayout, block_bounds
from drivers.engine.io._cell_blocks import CellBlocks
from drivers.engine.io._npz_stream import Rows, npz_index, stream_digest, write_npz
from meshes._sphere_blocks import icosphere_cell_block
from meshes.control_volumes import control_volumes
from meshes.sphere import icosphere, icosphere_arrays

COMM = MPI.COMM_WORLD


def _agree(ok: bool) -> bool:
    return bool(COMM.allreduce(bool(ok), op=MPI.LAND))


def _shared(shared_tmp: Path, name: str) -> Path:
    path = shared_tmp / name
    if COMM.rank == 0:
        path.mkdir(parents=True, exist_ok=True)
    COMM.barrier()
    return path


@pytest.fixture(scope="module")
def sphere():
    return control_volumes(icosphere(COMM, 2))


def test_blocks_against_numpy():
    """A random partition of range(n) over the ranks: to_block gives the global array's
    block, fetch gives the rows asked for; a non-partition is one error on every rank."""
    n = 101
    rng = np.random.default_rng(3)
    perm = rng.permutation(n)
    mine = np.array_split(perm, COMM.size)[COMM.rank]
    values = np.column_stack([mine * 2.0, mine + 0.5])
    layout = BlockLayout(COMM, mine, n)
    lo, hi = block_bounds(n, COMM.size)[COMM.rank : COMM.rank + 2]
    whole = np.column_stack([np.arange(n) * 2.0, np.arange(n) + 0.5])
    assert _agree(np.array_equal(layout.to_block(values), whole[lo:hi]))
    wanted = rng.integers(0, n, size=17 + COMM.rank)
    assert _agree(np.array_equal(layout.fetch(whole[lo:hi], wanted), whole[wanted]))
    with pytest.raises(ValueError, match="partition"):
        BlockLayout(COMM, np.zeros(3, dtype=np.int64), n)


def test_density_h5_equals_the_serial_arrays(sphere, shared_tmp):
    """density.h5 from the collective writer: geometry and topology are the icosphere's input
    arrays, each step's values are by original cell index (independent of the rank count)."""
    folder = _shared(shared_tmp, "h5")
    cv = sphere
    rho = cv.original_index[: cv.n_owned] * 1.0
    writer = DensityWriter(cv, folder / "density.xdmf")
    writer.write(0.0, rho)
    writer.write(0.25, rho + 1.0)
    writer.close()
    ok = True
    if COMM.rank == 0:
        x, cells = icosphere_arrays(2)
        with h5py.File(folder / "density.h5", "r") as f:
            # the nodes are numbered by the parallel builder (meshes/_sphere_blocks.py), not
            # like icosphere_arrays: the cells' vertex coordinates, in order, are the same
            geometry, topology = f["/Mesh/mesh/geometry"][()], f["/Mesh/mesh/topology"][()]
            ok = geometry.shape == x.shape and np.array_equal(geometry[topology], x[cells])
            ok = ok and np.array_equal(topology, icosphere_cell_block(2, 0, len(cells)))
            ok = ok and f["/Mesh/mesh/topology"].dtype == np.int64
            for k, t in enumerate([0.0, 0.25]):
                ds = f[f"/Function/density/{k}"]
                ok = ok and ds.shape == (len(cells), 1) and float(ds.attrs["t"]) == t
                ok = ok and np.array_equal(ds[:, 0], np.arange(len(cells)) + k)
                ok = ok and ds.chunks is None and ds.compression is None
    assert _agree(ok)


def test_npz_stream_is_what_savez_writes(shared_tmp, monkeypatch):
    """Streamed in 48-byte chunks from row blocks: np.load gives the arrays np.savez would,
    the CRC-32 checks pass, the digest is the checkpoint's, members read back by rows."""
    monkeypatch.setattr(npz_stream, "CHUNK_BYTES", 48)
    folder = _shared(shared_tmp, "npz")
    n = 37
    lo, hi = block_bounds(n, COMM.size)[COMM.rank : COMM.rank + 2]
    whole = {
        "points": np.arange(3.0 * n).reshape(n, 3) / 7.0,
        "ids": np.arange(n, dtype=np.int64) ** 2,
        "t": np.float64(0.125),
        "name": np.array("fv"),
    }
    members = {
        "points": Rows(whole["points"][lo:hi], int(lo)),
        "ids": Rows(whole["ids"][lo:hi], int(lo)),
        "t": whole["t"],
        "name": whole["name"],
    }
    digest = write_npz(COMM, folder / "a.npz", members, digest=True)
    ok = True
    if COMM.rank == 0:
        with np.load(folder / "a.npz") as data:
            ok = sorted(data.files) == sorted([*whole, "sha256"])
            for key, value in whole.items():
                ok = ok and data[key].dtype == value.dtype and np.array_equal(data[key], value)
            ok = ok and str(data["sha256"]) == digest == _digest(whole)
        index = npz_index(folder / "a.npz")
        ok = ok and stream_digest(index) == digest
        ok = ok and np.array_equal(index["points"].rows(5, 9), whole["points"][5:9])
    assert _agree(ok)


def test_writers_hold_no_whole_array_on_rank0(shared_tmp, monkeypatch):
    """Peak allocation (tracemalloc) of the final.npz writer on every rank while it streams
    a 3.2 MB distributed array in 64 KiB chunks: below a quarter of the array plus the rank's
    own rows (a gather to rank 0 would need the whole 3.2 MB there)."""
    monkeypatch.setattr(npz_stream, "CHUNK_BYTES", 64 << 10)
    folder = _shared(shared_tmp, "memory")
    n = 400_000
    lo, hi = block_bounds(n, COMM.size)[COMM.rank : COMM.rank + 2]
    rows = np.arange(lo, hi, dtype=np.float64)
    tracemalloc.start()
    write_npz(COMM, folder / "big.npz", {"density": Rows(rows, int(lo)), "t": np.float64(1)})
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    peaks = COMM.allgather(peak)
    assert max(peaks) < n * 8 // 4, peaks
    ok = True
    if COMM.rank == 0:
        with np.load(folder / "big.npz") as data:
            ok = np.array_equal(data["density"], np.arange(n, dtype=np.float64))
    assert _agree(ok)


def _saved_cells(cv) -> dict[str, np.ndarray]:
    g = cv.original_index[: cv.n_owned]
    return {"density": np.sin(g + 0.5), "potential": np.exp(-g / 100.0)}


def test_checkpoint_restores_on_other_rank_counts(sphere, shared_tmp):
    """Saved on COMM_WORLD, restored on each rank's own COMM_SELF mesh (N -> 1), and saved on
    COMM_SELF by rank 0, restored on COMM_WORLD (1 -> N): every owned cell gets its own
    values, bit for bit; the digest checks out (lazy load)."""
    folder = _shared(shared_tmp, "ckpt")
    single = control_volumes(icosphere(MPI.COMM_SELF, 2))
    for cv_save, cv_load, where in [(sphere, single, "n_to_1"), (single, sphere, "1_to_n")]:
        out = folder / where
        if cv_save.comm.size == COMM.size or COMM.rank == 0:
            cells = CellBlocks(cv_save)
            members = {
                f"state_{k}": Rows(cells.block(v), cells.start)
                for k, v in _saved_cells(cv_save).items()
            }
            members["t"] = np.float64(0.5)
            save_checkpoint_collective(cv_save.comm, out, 4, members)
        COMM.barrier()
        state = None
        if cv_load.comm.rank == 0:
            state, _ = load_latest_checkpoint(out, lazy=True)
        state = cv_load.comm.bcast(state, root=0)
        restored = restore_cells(state, CellBlocks(cv_load))
        expected = _saved_cells(cv_load)
        ok = sorted(restored) == sorted(expected)
        ok = ok and all(np.array_equal(restored[k], expected[k]) for k in expected)
        assert _agree(ok), where


@pytest.mark.parametrize("chunk", [1 << 16, 7])
def test_picture_copy_is_the_cell_means_on_a_coarser_icosphere(chunk, monkeypatch):
    """Level 3 seen at level 2 (limit 320 cells): each coarse value is the mass-weighted mean
    of the fine cells whose centres lie in that coarse triangle, found by brute force; the
    ancestor check in one pass or in passes of 7 cells. Coarse faces in another order fail
    the check: no copy (None on every rank)."""
    import meshes.sphere
    from drivers.engine.io import _cell_blocks

    monkeypatch.setattr(_cell_blocks, "CHECK_CHUNK", chunk)
    cv = control_volumes(icosphere(COMM, 3))
    rho = np.exp(2.0 * cv.centres[: cv.n_owned, 0]) + cv.original_index[: cv.n_owned] % 3
    cells = CellBlocks(cv)
    coarse = cells.coarsened(rho, limit=320)
    gathered = CellBlocks(cv)
    centres, masses = gathered.gather(cv.centres[: cv.n_owned]), gathered.gather(rho)
    areas = gathered.gather(cv.measures[: cv.n_owned])
    ok = coarse is not None
    if COMM.rank == 0 and ok:
        vertices, values = coarse
        x, f = icosphere_arrays(2)
        tri = x[f]  # (320, 3, 3)
        normals = np.stack([np.cross(tri[:, k], tri[:, (k + 1) % 3]) for k in range(3)], 1)
        inside = np.einsum("ckj,nj->nck", normals, centres).min(axis=2) > -1e-12
        owner = inside.argmax(axis=1)
        ok = bool(np.all(inside.sum(axis=1) == 1)) and np.array_equal(vertices, tri)
        mass = np.bincount(owner, weights=masses * areas, minlength=320)
        area = np.bincount(owner, weights=areas, minlength=320)
        ok = ok and np.allclose(values, mass / area, rtol=1e-12, atol=0)
    assert _agree(ok)
    assert cells.coarsened(rho, limit=1280) is None  # not coarser than the mesh itself

    def shuffled(level: int):
        x, f = icosphere_arrays(level)
        return x, np.roll(f, 1, axis=0)  # cell i's ancestor is no longer face i mod n_c

    monkeypatch.setattr(meshes.sphere, "icosphere_arrays", shuffled)
    assert cells.coarsened(rho, limit=320) is None

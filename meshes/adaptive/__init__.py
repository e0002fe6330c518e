"""Nested adaptive meshes of S^2 and S^1 that can follow the clusters (issue 16, foundation).

What it is
----------
A forest of cells on the sphere, refined and coarsened between a ``base_level`` and a
``max_level`` of the uniform hierarchies of :mod:`meshes.sphere`:

- :class:`SphereForest` (S^2): the roots are the ``20 * 4**base_level`` icosphere triangles; a
  cell splits into its four red children and four sibling leaves merge back into their parent.
- :class:`CircleForest` (S^1): the roots are the ``16 * 2**base_level`` arcs of the regular
  polygon; an arc splits into two halves and two sibling halves merge back.

Both keep the 2:1 balance on demand (``balance()``: a leaf whose edge neighbour is two or more
levels finer is refined, until there is none; ``coarsen`` refuses merges that would break it),
list their ``neighbours()`` across edges, and export a ``conforming_mesh()``: the leaves, each
S^2 leaf cut through the hanging midpoints of its edges (green closure), so the result is a
closed, outward-oriented, conforming triangulation whose triangles each lie in one leaf. With
``SphereForest(..., delaunay=True)`` the closure also splits two green leaves facing each other
across an edge, so that the triangulation is Delaunay (the JKO scheme's circumcentred fluxes). DOLFINx's
own ``refine`` (Plaza bisection: no coarsening, children not nested in general) is not used.

The midpoints
-------------
A new vertex is the great-circle midpoint ``m = (x_a + x_b) / |x_a + x_b|`` of a cell edge, so it
lies on the parent's geodesic edge and the children tile the parent's spherical triangle (arc)
exactly: the children's exact areas (Van Oosterom-Strackee solid angles, as in
:func:`meshes.control_volumes.spherical_triangle_area`) sum to the parent's to round-off, and all
leaves together to 4 pi (2 pi). Midpoints are cached by their vertex pair and shared by the
neighbouring cells; a uniform refinement reproduces :func:`meshes.sphere.icosphere_arrays` (and
``circle_arrays``) of the finer level bitwise.

The transfer
------------
Leaves are dyadic intervals of one integer line (root, then Morton path), so any two leaf sets of
one forest are nested partitions: each new leaf is inside one old leaf or a union of old leaves.
:func:`leaf_transfer` turns two snapshots (``forest.leaf_set()``) into an explicit sparse map
(:class:`Transfer`: pairs old -> new with weights): a refined leaf receives
``m_parent * a_child / sum(a_children)`` (the parent's density is kept), a merged leaf the sum of
its children, an unchanged leaf its own mass bitwise. The weights are >= 0 and those of one old
leaf sum to 1, so masses stay >= 0 and the total is conserved to round-off, over any number of
cycles::

    before = forest.leaf_set()
    forest.refine(to_refine); forest.balance(); forest.coarsen(to_coarsen_now)
    masses, transfer = transfer_masses(before, forest, masses)

The mesh
--------
:func:`forest_mesh` distributes the conforming triangulation as a DOLFINx mesh (its cells are the
finite volumes; a leaf is one cell or a few green pieces), :func:`leaf_masses` sums cell masses
per leaf and :func:`cell_masses` splits leaf masses over a leaf's cells by their exact areas, so
an adaptation is: cells -> leaves -> ``transfer_masses`` -> leaves -> cells of the new mesh,
conservative to round-off and never negative (module ``_mesh``).

Indicators
----------
:func:`refinement_indicator` (``"mass"``: m h, each leaf's share of a bound of the W1 error of
the cell measure; ``"jump"``: h |K| max |rho_i - rho_j|, the L1 error of a piecewise-constant
density) and :func:`adapt_forest` (merge, refine, balance, carry the masses; with
``grading = g`` also the graded refinement of :func:`graded_level`: no leaf more than one level
coarser than any leaf within g + 1 edge steps) are in ``_indicator``;
:class:`solvers.transport.AdaptiveScheme` runs any token scheme on the adapted meshes.

Accuracy target and energy
--------------------------
:func:`equidistribute` turns a ``tolerance`` on the sum of the indicators into the thresholds
of one adaptation (module ``_tolerance``; :func:`default_tolerance` is the default target);
:func:`energy_correction` moves mass inside refined leaves along the first variation of the
energy so that the cell-centre energy is continuous across an adaptation (module ``_energy``).

Parallel: the forest is replicated (pure numpy, the same on every rank); checkpoints store it
with ``forest.state()`` and ``SphereForest.from_state`` / ``CircleForest.from_state``.

The distributed forest
----------------------
:class:`DistributedSphereForest` (issue 32, item 3; module ``_distributed_s2``) holds on each
rank only a contiguous range of the leaves in Morton order, two int64 per leaf: a leaf is
(level, index in ``icosphere_arrays(level)``), its corners and every vertex are named by their
node ids in the analytic numbering of the uniform icosphere of ``max_level``, and the 2:1
balance, the red-green (and Delaunay) closure, the merges and the green cuts ask the owners
of vertex ids whether a vertex is active (point-to-point messages, module ``_exchange``; no
rank holds the whole forest). It makes the same leaves and triangles as :class:`SphereForest`
under the same marks, on any number of ranks; :meth:`DistributedSphereForest.mesh_blocks`
gives each rank its block of the triangulation for :func:`meshes.sphere.distribute_blocks`,
and :class:`LeafCells` carries cell values to the leaves' ranks and back (leaf sums, and
leaf totals split over their cells by measure; module ``_leaf_cells``), by point-to-point
messages instead of :func:`leaf_masses`' gather. :func:`distributed_adapt` is one adaptation
on the distributed leaves (mass indicator; :func:`distributed_equidistribute` and
:func:`distributed_default_tolerance` the accuracy target, with :func:`reproducible_sum`;
module ``_distributed_adapt``), what :class:`solvers.transport.DistributedAdaptiveScheme`
runs (``[adapt] forest = "distributed"``, docs/adaptivity.md).
"""

from meshes.adaptive._budget import BudgetMarks, budget_marks
from meshes.adaptive._delaunay import delaunay_margins
from meshes.adaptive._distributed_adapt import (
    distributed_adapt,
    distributed_default_tolerance,
    distributed_equidistribute,
    distributed_parent_indicator,
    leaf_indicator,
    mass_indicator,
    reproducible_sum,
)
from meshes.adaptive._distributed_budget import distributed_budget_marks
from meshes.adaptive._distributed_s2 import DistributedSphereForest
from meshes.adaptive._energy import EnergyCorrection, energy_correction
from meshes.adaptive._forest_s1 import MAX_CIRCLE_FOREST_LEVEL, CircleForest
from meshes.adaptive._forest_s2 import MAX_FOREST_LEVEL, SphereForest
from meshes.adaptive._indicator import (
    INDICATORS,
    AdaptCounts,
    adapt_forest,
    graded_level,
    leaf_centres,
    limited_slopes,
    parent_indicator,
    refinement_indicator,
)
from meshes.adaptive._leaf_cells import LeafCells
from meshes.adaptive._mesh import cell_masses, forest_mesh, leaf_masses, owner_leaves
from meshes.adaptive._tolerance import (
    COARSEN_RATIO,
    DEFAULT_TOLERANCE_FACTOR,
    Thresholds,
    default_tolerance,
    equidistribute,
    predicted_estimate,
)
from meshes.adaptive._transfer import LeafSet, Transfer, leaf_transfer, transfer_masses

__all__ = [
    "BudgetMarks",
    "budget_marks",
    "delaunay_margins",
    "DistributedSphereForest",
    "distributed_adapt",
    "distributed_budget_marks",
    "distributed_default_tolerance",
    "distributed_equidistribute",
    "distributed_parent_indicator",
    "leaf_indicator",
    "mass_indicator",
    "reproducible_sum",
    "LeafCells",
    "INDICATORS",
    "AdaptCounts",
    "adapt_forest",
    "graded_level",
    "leaf_centres",
    "limited_slopes",
    "parent_indicator",
    "refinement_indicator",
    "MAX_CIRCLE_FOREST_LEVEL",
    "MAX_FOREST_LEVEL",
    "CircleForest",
    "LeafSet",
    "SphereForest",
    "Transfer",
    "cell_masses",
    "forest_mesh",
    "leaf_masses",
    "leaf_transfer",
    "owner_leaves",
    "transfer_masses",
    "COARSEN_RATIO",
    "DEFAULT_TOLERANCE_FACTOR",
    "EnergyCorrection",
    "Thresholds",
    "default_tolerance",
    "energy_correction",
    "equidistribute",
    "predicted_estimate",
]

"""The configuration reference (docs/config.md) is the schema the validator uses, and in sync.

- docs/config.md is exactly what ``transformer-pde keys`` prints (regenerate with
  ``transformer-pde keys > docs/config.md``);
- the schema's keys are the keys ``validate`` accepts, and nothing else is accepted;
- every documented default validates, every listed allowed value passes the choice check and
  a value outside the list is refused naming the key;
- ``run --help`` points to the reference; the oscillating heads' phases (``weights.phases``)
  do what the reference says.
"""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from drivers.engine import ConfigError, load_config
from drivers.engine._config import DEFAULTS, validate
from drivers.engine._schema import GAUSSIAN_KEYS, KEYS, SECTIONS, reference

ROOT = Path(__file__).resolve().parents[1]


def test_docs_config_md_is_the_generated_reference():
    text = (ROOT / "docs" / "config.md").read_text()
    assert text == reference(), (
        "docs/config.md is stale: run `transformer-pde keys > docs/config.md`"
    )


@pytest.mark.serial
def test_keys_command_prints_the_reference():
    out = subprocess.run(
        [sys.executable, "-m", "drivers", "keys"], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout == reference()


@pytest.mark.serial
def test_config_code_imports_no_petsc():
    """Importing the config code (load_config, validate, the schema) imports neither PETSc nor
    DOLFINx, so a script can hand its options to petsc4py.init after it (reading a config
    then imports them)."""
    code = (
        "import sys\n"
        "import drivers.engine._config, drivers.engine._schema\n"
        "from drivers.engine import load_config, validate, ConfigError\n"
        "heavy = ('petsc4py', 'dolfinx', 'solvers.transport')\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in heavy[:2] or m in heavy))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.splitlines() == ["[]"], proc.stdout


def test_schema_tables_quote_the_registry():
    from solvers.transport import SCHEME_SPECS

    scheme = next(k for k in KEYS if (k.section, k.name) == ("time", "scheme"))
    assert scheme.choices == tuple(SCHEME_SPECS)
    assert all(s.summary in scheme.meaning for s in SCHEME_SPECS.values())
    assert DEFAULTS["time"]["scheme"] == "fv" and set(SECTIONS) == set(DEFAULTS)


def test_owned_petsc_prefixes_come_from_the_specs():
    from drivers.engine._petsc_options import WEIGHT_LAW_PREFIX, owned
    from drivers.engine._problem import scheme_options
    from solvers.transport import SCHEME_SPECS

    prefixes = {
        s.petsc_options_prefix: n for n, s in SCHEME_SPECS.items() if s.petsc_options_prefix
    }
    assert prefixes == {"jko_": "jko"}
    table = owned()
    assert set(table) == {*prefixes, WEIGHT_LAW_PREFIX}
    assert table["jko_"] == ("the JKO scheme", ("time", "scheme"), "jko")
    cfg = validate({"time": {"scheme": "jko", "dt": 0.1}})
    assert scheme_options(cfg).petsc_options_prefix == "jko_"


def test_every_key_is_documented_and_accepted():
    documented = {(k.section, k.name) for k in KEYS}
    accepted = {(s, k) for s, table in DEFAULTS.items() for k in table}
    assert documented == accepted
    assert set(SECTIONS) == set(DEFAULTS)
    for key in KEYS:  # every row is complete: a meaning and a type in words
        assert key.meaning and key.type, key
        assert (key.section, key.name) != ("", "")
    text = reference()
    for key in KEYS + GAUSSIAN_KEYS:
        assert f"| `{key.name}` |" in text


def test_unknown_keys_are_refused_by_name():
    with pytest.raises(ConfigError, match="attention.velocty"):
        validate({"attention": {"velocty": "gradient"}})
    with pytest.raises(ConfigError, match="unknown section"):
        validate({"attentoin": {}})


@pytest.mark.parametrize("key", KEYS, ids=lambda k: f"{k.section}.{k.name}")
def test_documented_default_validates(key):
    cfg = validate({key.section: {key.name: key.default}})
    if not key.choices:
        return
    assert cfg[key.section][key.name] == key.default
    with pytest.raises(ConfigError, match=f"{key.section}.{key.name}.*must be one of"):
        validate({key.section: {key.name: "no-such-value"}})


@pytest.mark.parametrize(
    "key, value",
    [(k, c) for k in KEYS for c in k.choices],
    ids=lambda x: x if isinstance(x, str) else f"{x.section}.{x.name}",
)
def test_every_allowed_value_passes_the_choice_check(key, value):
    try:
        validate({key.section: {key.name: value}})
    except ConfigError as exc:  # only a rule tying keys together may refuse it, not the list
        assert "must be one of" not in str(exc), exc


def test_gaussian_defaults_are_the_schema_defaults(tmp_path):
    from drivers.engine._gaussian_command import load_gaussian_config

    path = tmp_path / "g.toml"
    path.write_text("[gaussian]\nm0 = [0.5, -0.5]\n")
    cfg = load_gaussian_config(path)
    defaults = {k.name: k.default for k in GAUSSIAN_KEYS}
    assert cfg["t_end"] == defaults["t_end"] and cfg["outputs"] == defaults["outputs"]
    assert np.array_equal(cfg["S0"], np.eye(2)) and defaults["S0"] == "identity"
    assert np.array_equal(cfg["A"], np.zeros((2, 2))) and defaults["A"] == "zero"
    with pytest.raises(ConfigError, match="gaussian.z"):
        (tmp_path / "h.toml").write_text("[gaussian]\nm0 = [0.0]\nz = 1\n")
        load_gaussian_config(tmp_path / "h.toml")


@pytest.mark.serial
def test_run_help_points_to_the_reference():
    out = subprocess.run(
        [sys.executable, "-m", "drivers", "run", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0
    assert "transformer-pde keys" in out.stdout and "docs/config.md" in out.stdout
    for word in ("exit codes", "PETSc options", "density.xdmf", "metrics.csv"):
        assert word in out.stdout
    assert "``" not in out.stdout  # no RST markup on the terminal


def _head_average(weights, t):
    return weights.forcing_at(t).mean(axis=0)


@pytest.mark.parametrize("H", [3, 4, 7])
def test_equispaced_phases_average_out_the_forcing(H):
    """(1/H) sum_h F(t + 2 pi h / H) = 2 I for H >= 3 (frequencies 1 and 2 cancel)."""
    from solvers.weights import OscillatingWeights, random_symmetric

    w = OscillatingWeights(random_symmetric(H, 3, 0))
    for t in np.linspace(0.0, 7.0, 11):
        assert np.allclose(_head_average(w, t), 2.0 * np.eye(3), atol=1e-13, rtol=0)


def test_two_equispaced_heads_and_random_phases_do_not_average_out():
    from solvers.weights import OscillatingWeights, oscillation_phases, random_symmetric

    two = OscillatingWeights(random_symmetric(2, 3, 0))  # frequency 2 survives for H = 2
    spread = np.ptp([_head_average(two, t)[0, 1] for t in np.linspace(0, 3, 13)])
    assert spread > 0.5
    rand = OscillatingWeights(random_symmetric(10, 3, 0), phases="random", seed=3)
    assert not np.allclose(rand.phases, oscillation_phases(10))
    assert np.all((rand.phases >= 0) & (rand.phases < 2 * math.pi))
    avg = np.array([_head_average(rand, t) for t in np.linspace(0, 2 * math.pi, 17)])
    assert np.ptp(avg, axis=0).max() > 0.05  # the average still oscillates
    again = OscillatingWeights(random_symmetric(10, 3, 0), phases="random", seed=3)
    assert np.array_equal(again.phases, rand.phases)  # seeded


def test_phases_config():
    from drivers.engine._problem import build_model
    from solvers.weights import oscillation_phases

    three = "[" + ", ".join(['{Q="identity", K="identity", V="identity"}'] * 3) + "]"
    sets = ['weights.dynamics="oscillating"', f"attention.heads={three}", "mesh.refinement=0"]
    _, equi = build_model(load_config(None, sets))
    assert np.array_equal(equi.phases, oscillation_phases(3))
    _, rand = build_model(load_config(None, [*sets, 'weights.phases="random"']))
    assert rand.n_heads == 3 and not np.allclose(rand.phases, equi.phases)
    with pytest.raises(ConfigError, match="weights.phases"):
        load_config(None, ['weights.dynamics="ou"', 'weights.phases="random"'])
    with pytest.raises(ConfigError, match="weights.phases"):
        load_config(None, ['weights.phases="uniform"'])

"""One engine parameter table (`robots.engine_params.ENGINE_SPECS`) for the VLA node, the fleet node and `serve`:
one spec, one check, and the docs' tables checked against the specs."""

import re
from pathlib import Path

import pytest

from oxygen_ros.nodes.fleet_parameters import (
    ENGINE_NAMES,
    FLEET_SPECS,
    PER_ROBOT_PARAMETERS,
    fleet_engine,
    read_fleet,
)
from oxygen_ros.nodes.parameters import OPTIONAL, REQUIRED, SPECS
from oxygen_ros.robots.engine_params import ENGINE, ENGINE_SPECS, ParameterError, read_engine
from oxygen_ros.serving.params import engine_parameters

REPO = Path(__file__).resolve().parents[2]


def shown(default) -> str:
    """A default as the docs' tables write it."""
    if default is REQUIRED:
        return "required"
    if default is OPTIONAL:
        return "unset"
    if isinstance(default, bool):
        return f"`{str(default).lower()}`"
    if isinstance(default, list):
        return "`[" + ", ".join(f'"{v}"' for v in default) + "]`"
    return '`""`' if default == "" else f"`{default}`"


def table(page: str, header: str = "parameter") -> dict[str, str]:
    """parameter -> default of a page's `| <header> | default | meaning |` table."""
    text = (REPO / "docs" / page).read_text()
    body = text.split(f"| {header} | default | meaning |\n|---|---|---|\n", 1)[1].split("\n\n", 1)[0]
    return dict(re.findall(r"^\| `([^`]+)` \| ([^|]+?) \|", body, re.M))


def test_the_docs_tables_are_the_specs():
    assert table("nodes.md") == {spec.name: shown(spec.default) for spec in SPECS}
    assert table("fleet.md") == {spec.name: shown(spec.default) for spec in FLEET_SPECS}
    robot = {spec.name: spec for spec in (*SPECS, *FLEET_SPECS)}  # a robot's: the node's defaults
    assert table("fleet.md", "robot parameter") == {name: shown(robot[name].default) for name in PER_ROBOT_PARAMETERS}
    serve = (REPO / "docs" / "serve.md").read_text()
    assert [spec.name for spec in ENGINE_SPECS if f"`{spec.name}`" not in serve] == []


def test_every_front_end_reads_the_engine_parameters_from_the_one_table():
    assert all(ENGINE[spec.name] is spec for spec in SPECS if spec.name in ENGINE)  # the VLA node's are the table's
    assert {spec.name for spec in ENGINE_SPECS} <= {spec.name for spec in SPECS}
    fleet = {spec.name: spec for spec in FLEET_SPECS}
    for name, engine_name in ENGINE_NAMES.items():  # the fleet node's: the same spec under its own name
        assert (fleet[name].description, fleet[name].read) == (ENGINE[engine_name].description,
                                                               ENGINE[engine_name].read)
    defaults = {spec.name: spec.default for spec in FLEET_SPECS}
    engine = fleet_engine(read_fleet(defaults))
    assert (engine.max_new_tokens, engine.tokens_per_frame, engine.rate_hz, engine.default_instruction) == \
        (32, 0, 10.0, "do the task")


@pytest.mark.parametrize("engine_name, value, line", [
    ("language.max_new_tokens", 0, "must be an integer >= 1, got 0"),
    ("model.cpu_kernel", "sometimes", "must be one of auto | on | off, got 'sometimes'"),
    ("control.rate_hz", 0.0, "must be > 0, got 0.0"),
    ("cameras.max_pixels", -1, "must be an integer >= 0, got -1"),
])
def test_a_bad_engine_value_is_the_same_line_in_every_front_end(engine_name, value, line):
    """The VLA node's and serve's dotted name, the fleet node's flat one: one check, one line."""
    defaults = {spec.name: spec.default for spec in ENGINE_SPECS}
    with pytest.raises(ParameterError, match=f"^{re.escape(engine_name)} {re.escape(line)}$"):
        read_engine({**defaults, engine_name: value})
    with pytest.raises(ParameterError, match=f"^{re.escape(engine_name)} {re.escape(line)}$"):
        engine_parameters([], [f"{engine_name}={value}"])
    flat = next(name for name, dotted in ENGINE_NAMES.items() if dotted == engine_name)
    with pytest.raises(ParameterError, match=f"^{re.escape(flat)} {re.escape(line)}$"):
        read_fleet({**{spec.name: spec.default for spec in FLEET_SPECS}, flat: value})


def test_the_fleet_nodes_own_parameters_are_checked_by_their_specs():
    defaults = {spec.name: spec.default for spec in FLEET_SPECS}
    for name, value, line in (("max_batch", 0, "max_batch must be an integer >= 1, got 0"),
                              ("status_rate_hz", 0.0, "status_rate_hz must be > 0, got 0.0"),
                              ("design", "lockstep", "design must be one of monolithic | robion | disaggregated, "
                                                     "got 'lockstep'"),
                              ("robots", ["a", "a"], "robots lists ['a'] more than once")):
        with pytest.raises(ParameterError) as error:
            read_fleet({**defaults, name: value})
        assert str(error.value) == line

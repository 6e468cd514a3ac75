"""Flags derived from settings dataclasses (seqpack.cli.flags) and DemoSettings' own flags."""

from __future__ import annotations

import argparse
import dataclasses
from enum import StrEnum

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from seqpack.cli.demo.settings import CostSource, DemoMode, DemoSettings, FsdpUnits
from seqpack.cli.flags import add_options, flag_name, from_args, option
from seqpack.errors import ConfigError


class Color(StrEnum):
    RED = "red"
    BLUE = "blue"


@dataclasses.dataclass(frozen=True)
class Toy:
    count: int = option(3, help="how many")
    ratio: float = option(0.5, help="a share, 50% by default")
    name: str = option("x", help="a name")
    color: Color = option(Color.RED, help="a color")
    colors: tuple[Color, ...] = option((Color.RED,), help="colors")
    sizes: tuple[int, ...] = option((1, 2), help="sizes")
    out: str | None = option(None, help="a file", metavar="FILE")
    loud: bool = option(False, help="shout")
    fancy: bool = option(True, help="on unless --no-fancy")


def _parse(cls, argv):
    parser = argparse.ArgumentParser()
    add_options(parser, cls)
    return from_args(cls, parser.parse_args(argv))


def test_every_field_becomes_a_flag_with_its_default():
    assert _parse(Toy, []) == Toy()
    got = _parse(
        Toy,
        ["--count", "7", "--ratio", "0.25", "--name", "y", "--color", "blue", "--colors", "blue,red",
         "--sizes", "4, 5,", "--out", "f.json", "--loud", "--no-fancy"],
    )  # fmt: skip
    assert got == Toy(7, 0.25, "y", Color.BLUE, (Color.BLUE, Color.RED), (4, 5), "f.json", True, False)
    assert flag_name(dataclasses.fields(Toy)[2]) == "--name" and flag_name("max_seq_len") == "--max-seq-len"


def test_help_names_defaults_and_choices(capsys):
    parser = argparse.ArgumentParser()
    add_options(parser, Toy)
    text = parser.format_help()
    assert "how many (default: 3)" in text and "50% by default" in text  # '%' survives argparse
    assert "{red,blue}" in text and "of red, blue" in text and "--out FILE" in text
    with pytest.raises(SystemExit):
        parser.parse_args(["--color", "green"])
    assert "invalid choice: 'green'" in capsys.readouterr().err


def test_unsupported_fields_are_refused_when_the_parser_is_built():
    @dataclasses.dataclass
    class NoDefault:
        x: int

    @dataclasses.dataclass
    class Listy:
        x: list = dataclasses.field(default_factory=list)

    for cls in (NoDefault, Listy):
        with pytest.raises(TypeError):
            add_options(argparse.ArgumentParser(), cls)


def test_demo_flags_are_derived_from_demo_settings():
    parser = argparse.ArgumentParser()
    add_options(parser, DemoSettings)
    flags = {a.dest for a in parser._actions if a.dest != "help"}
    assert flags == {f.name for f in dataclasses.fields(DemoSettings)}
    assert from_args(DemoSettings, parser.parse_args([])) == DemoSettings()


settings_values = st.fixed_dictionaries(
    {
        "dp": st.integers(1, 4),
        "cp": st.sampled_from([1, 2, 4, 8]),
        "steps": st.integers(1, 9),
        "warmup_steps": st.integers(0, 3),
        "modes": st.lists(st.sampled_from(list(DemoMode)), min_size=1, max_size=3, unique=True).map(tuple),
        "samples_per_rank": st.integers(1, 64),
        "d_model": st.sampled_from([32, 64, 128]),
        "pattern": st.text("AM", min_size=1, max_size=5),
        "lr": st.floats(1e-5, 1.0),
        "seed": st.integers(0, 2**31),
        "cost": st.sampled_from(list(CostSource)),
        "fsdp_units": st.sampled_from(list(FsdpUnits)),
        "json_out": st.one_of(st.none(), st.just("result.json")),
        "quiet": st.booleans(),
    }
)


@given(settings_values)
@pytest.mark.slow
def test_settings_round_trip_through_the_command_line(values):
    try:
        settings = DemoSettings(**values)
    except ConfigError:  # e.g. a --cp that does not divide Mamba's heads
        assume(False)
    argv = []
    for field in dataclasses.fields(DemoSettings):
        value = getattr(settings, field.name)
        if isinstance(value, bool):
            argv += [flag_name(field)] if value else []
        elif value is not None:
            argv += [flag_name(field), ",".join(value) if isinstance(value, tuple) else str(value)]
    assert _parse(DemoSettings, argv) == settings


def test_settings_coerce_strings_and_refuse_mistakes_from_python_too():
    s = DemoSettings(modes=("padded", "balanced"), cost="flops", fsdp_units="block")
    assert s.modes == (DemoMode.PADDED, DemoMode.BALANCED) and s.cost is CostSource.FLOPS
    with pytest.raises(ConfigError, match="--cost must be one of"):
        DemoSettings(cost="fast")
    with pytest.raises(ConfigError, match="--dp must be an integer >= 0, got -1"):
        DemoSettings(dp=-1)
    with pytest.raises(ConfigError, match="--cp 3"):
        DemoSettings(cp=3)

"""The ``plsh`` dispatcher: option spellings shared by the commands."""

import argparse
import importlib

import pytest

from plsh_ref.cli import COMMANDS


def _parse(command: str, argv: list[str]) -> argparse.Namespace:
    module = importlib.import_module(COMMANDS[command])
    parser = argparse.ArgumentParser()
    module.add_arguments(parser)
    return parser.parse_args(argv)


@pytest.mark.parametrize(
    "command,dest", [("reproduce", "out"), ("spectrum", "output"), ("train-lm", "out")]
)
def test_output_folder_option_has_both_spellings(command, dest):
    if command == "train-lm":
        pytest.importorskip("torch")
    long = vars(_parse(command, ["--output", "somewhere"]))[dest]
    short = vars(_parse(command, ["--out", "somewhere"]))[dest]
    assert str(long) == str(short) == "somewhere"


def test_reproduce_accepts_num_samples_for_its_list_of_s():
    assert _parse("reproduce", ["--num-samples", "1,4"]).samples == [1, 4]
    assert _parse("reproduce", ["--samples", "1,4"]).samples == [1, 4]

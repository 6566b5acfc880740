"""One home for each option: every field carries its flag, and the command line, the checks
and the fuzz test are made from the fields."""
from dataclasses import dataclass, fields

import pytest

from ddp_abci import train as command
from ddp_abci.autoencoder_job import AutoencoderJob
from ddp_abci.cli import OneLineParser, add_options, build
from ddp_abci.compare.accelerate_variant import build_parser as accelerate_parser
from ddp_abci.config import TrainConfig
from ddp_abci.errors import UsageError
from ddp_abci.options import flag_of, not_a_flag, option
from ddp_abci.parallel.launch import LaunchOptions

CLASSES = (TrainConfig, AutoencoderJob, LaunchOptions)


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_every_field_is_a_flag_of_the_command_line_or_says_why_not(cls):
    parser = command.build_parser()
    by_flag = {flag: action for action in parser._actions for flag in action.option_strings}
    for f in fields(cls):
        flag = flag_of(f)
        if flag is None:
            assert f.metadata["not_a_flag"].strip(), f.name  # marked, with the reason
            continue
        assert by_flag[flag].dest == f.name and by_flag[flag].help == f.metadata["help"], f.name


def test_the_command_line_builds_each_dataclass_from_its_own_flags():
    args = command.build_parser().parse_args(["--bs", "64", "--betas", "0.9", "0.999", "--no-fused-adam",
                                              "--dim-hidden", "32", "--drop-last", "--master-port", "2950"])
    config, job, options = build(TrainConfig, args), build(AutoencoderJob, args), build(LaunchOptions, args)
    assert (config.global_batch, config.betas, config.fused_adam, config.drop_last) == (64, (0.9, 0.999), False, True)
    assert job == AutoencoderJob(dim_hidden=32) and options == LaunchOptions(master_port=2950)


def test_a_new_option_is_one_edit_its_field():
    @dataclass(frozen=True)
    class Extra:
        warm_restarts: int = option(0, "restart the schedule this many times", low=0)
        callback: object = not_a_flag(None, "a callable")

    parser = OneLineParser(prog="x")
    add_options(parser, Extra)
    assert build(Extra, parser.parse_args(["--warm-restarts", "3"])).warm_restarts == 3
    assert all(flag_of(f) != "--callback" for f in fields(Extra))


def test_a_range_names_the_field_and_its_flag():
    with pytest.raises(UsageError, match=r"^num_items \(--num-items\) must be finite and between 1"):
        AutoencoderJob(num_items=0)
    with pytest.raises(UsageError, match=r"^unknown schedule \(--schedule\) 'step'; use one of constant, cosine"):
        TrainConfig(schedule="step")


def test_the_accelerate_variant_takes_the_trainers_flags_from_the_same_fields():
    parser = accelerate_parser()
    ours = {flag: action for action in parser._actions for flag in action.option_strings}
    for flag, name in (("--bs", "global_batch"), ("--epochs", "epochs"), ("--num-items", "num_items")):
        assert ours[flag].dest == name
    assert parser.parse_args([]).amp == "no"  # its own default, from the same field

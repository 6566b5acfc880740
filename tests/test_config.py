"""TrainConfig (config.py): its checks, and what a checkpoint keeps of it."""

import pytest

from ddp_abci.config import TrainConfig
from ddp_abci.errors import UsageError


def test_resume_without_a_checkpoint_folder_is_refused():
    with pytest.raises(UsageError, match="--ckpt-dir"):
        TrainConfig(resume=True)


def test_the_config_in_a_checkpoint_is_plain_data():
    assert TrainConfig().to_dict()["betas"] == [0.0, 0.99]

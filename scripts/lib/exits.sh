# shellcheck shell=bash
# The exit statuses, as ddp_abci/exits.py names them (tests/test_exits.py checks each against it);
# what each means: python -m ddp_abci.jobs explain STATUS, or exits.MEANINGS.
# shellcheck disable=SC2034  # sourced: the scripts use some of them
EXIT_DONE=0
EXIT_FAILED=1
EXIT_USAGE=2
EXIT_DIVERGED=65
EXIT_RANK_LOST=69
EXIT_SAVE_FAILED=74
EXIT_STOPPED=75

"""fit()'s own helpers (fitting.py)."""

import pytest


@pytest.mark.parametrize("enabled_before", [True, False])
def test_torch_loads_with_the_collector_paused_and_its_state_is_restored(enabled_before):
    import gc

    from ddp_abci.fitting import collector_paused

    (gc.enable if enabled_before else gc.disable)()
    try:
        with collector_paused():
            assert not gc.isenabled()
        assert gc.isenabled() == enabled_before
    finally:
        gc.enable()

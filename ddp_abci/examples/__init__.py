"""Examples that train your own model through ddp_abci.fit (run each as `python -m ddp_abci.examples.NAME`)."""

"""Installs R-03's recorder (powerloss_shim) in a daemon started with AMBIENT_TEST_POWERLOSS_LOG set."""

import os

if os.environ.get("AMBIENT_TEST_POWERLOSS_LOG"):
    import powerloss_shim

    powerloss_shim.install(os.environ["AMBIENT_TEST_POWERLOSS_LOG"], os.environ["AMBIENT_TEST_POWERLOSS_ROOT"])

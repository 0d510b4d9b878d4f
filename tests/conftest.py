"""Test-session settings shared by every test directory."""

import os

import torch

# The suite's problems are tiny: one BLAS thread is faster for them and keeps the unit tests from
# fighting the Streamlit server of the browser tests (or other jobs) for the 2 CI cores.
torch.set_num_threads(int(os.environ.get("UA_TEST_THREADS", "1")))

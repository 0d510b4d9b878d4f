"""The shared battery for the foundation's models (DBK variants and the exact GP)."""

from tests.gpcore.models.battery import ModelBattery


class TestDBKSiLUBattery(ModelBattery):
    name = "dbk-silu"
    settings = {"rank": 16, "hidden": 16, "epochs": 8, "batch_size": 32, "lr": 1e-2}


class TestDBKRBFBattery(ModelBattery):
    name = "dbk-rbf"
    settings = {"rank": 16, "hidden": 8, "epochs": 8, "batch_size": 32, "lr": 1e-2}


class TestDBKMMLBattery(ModelBattery):
    name = "dbk-mml"
    settings = {"rank": 16, "hidden": 16, "epochs": 15, "lr": 1e-2}


class TestExactBattery(ModelBattery):
    name = "exact"
    settings = {"epochs": 30}

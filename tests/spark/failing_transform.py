"""A transform that fails inside the Spark job, after the batch was planned and read."""


def explode(df):
    raise RuntimeError("injected failure in the user transform")

"""A transform that makes the write stage slow (so a test can kill the job mid-write)."""


def slow(df):
    import time

    def pause(batches):
        for batch in batches:
            time.sleep(1.5)
            yield batch

    return df.mapInArrow(pause, df.schema)

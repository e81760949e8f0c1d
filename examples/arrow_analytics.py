"""Records as Arrow for analytics on one machine: pandas, polars and DuckDB on a store's topic.

Run with ``make demo``. ``LogStore.read_arrow`` returns a ``pyarrow.Table`` in the Spark Kafka
source's schema (key, value, topic, partition, offset, timestamp, timestampType), built from the
C decoder's columns; pandas, polars and DuckDB take it as it is. Needs pyarrow
(``pip install 'logstore[arrow]'``); each of the three tools is used when it is installed.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import tempfile

import logstore


def main() -> None:
    root = tempfile.mkdtemp(prefix="logstore-arrow-")
    try:
        with logstore.LogStore(root) as store:
            store.create_topic("orders", 3)
            for p in range(3):
                orders = [{"user": f"user-{i % 7}", "amount": (i * 37) % 100} for i in range(10_000)]
                store.partition("orders", p).append_batch([json.dumps(o).encode() for o in orders],
                                                          keys=[o["user"].encode() for o in orders])
            orders = store.read_arrow("orders")  # every partition; columns=[...] builds fewer
            print(f"read_arrow: {orders.num_rows} records, columns {orders.schema.names}")
            last = store.read_arrow("orders", partitions=[0], start=9_995, columns=["offset", "key"])
            print(f"the last five of partition 0: {last.to_pydict()}")

            if importlib.util.find_spec("pandas") is None:
                print("pandas is not installed: skipped")
            else:
                frame = orders.to_pandas()
                print("pandas, records per partition:", frame.groupby("partition").size().to_dict())

            try:
                import polars
            except ImportError:
                print("polars is not installed: skipped")
            else:
                frame = polars.from_arrow(orders)
                top = frame.group_by("key").len().sort("len", descending=True).head(3)
                print("polars, busiest keys:", [(k.decode(), n) for k, n in top.rows()])

            try:
                import duckdb
            except ImportError:
                print("duckdb is not installed: skipped")
            else:
                # DuckDB reads the Arrow table by the name of the Python variable holding it.
                rows = duckdb.sql('select "partition", count(*), count(distinct key), max(timestamp) '
                                  'from orders group by 1 order by 1').fetchall()
                print("duckdb, per partition (records, distinct keys, newest):",
                      [(p, n, k, str(t)) for p, n, k, t in rows])
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()

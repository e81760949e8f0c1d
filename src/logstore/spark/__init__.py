"""The PySpark data source ``logstore``: options, driver planning, executors' Arrow decoding, the writer."""

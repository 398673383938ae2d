"""Partitioned execution: the state split over dask workers, the time loop run by the workers themselves."""

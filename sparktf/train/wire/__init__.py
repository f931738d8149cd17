"""The messages between a run's processes: the driver's control channel, the authenticated
reservation, their framing, servers and connection limits. Imports nothing else of the run.
"""

__all__: list[str] = []

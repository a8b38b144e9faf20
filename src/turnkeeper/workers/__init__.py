"""Worker processes: their runtime (connections opened after fork), lease heartbeats and
failpoints. Import the modules themselves: this package re-exports nothing, so that
``workers.failpoints`` imports without the driver."""

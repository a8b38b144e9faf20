// The Durable Streams conformance suite against DURABLE_STREAMS_URL (a turnkeeper web
// app behind tests/web/conformance_harness.py); which tests run is vitest's -t.
import { runConformanceTests } from "@durable-streams/server-conformance-tests"

runConformanceTests({
  baseUrl: process.env.DURABLE_STREAMS_URL,
  longPollTimeoutMs: Number(process.env.DURABLE_STREAMS_LONG_POLL_MS),
})

// Read a Durable Stream with the official client and print what it read as JSON.
//
// Usage: node durable_read.mjs '{"url": ..., "live": "sse"|"long-poll"|true|false,
//   "offset": "-1", "headers": {...}, "params": {...}, "stopAfter": N}'
//
// Reads until the stream is closed (or, with live false, up to date), or until
// `stopAfter` items arrived; prints {batches, items, offset, streamClosed} or
// {error: {name, status, code, message}}.
import { stream } from "@durable-streams/client"

const options = JSON.parse(process.argv[2])
const batches = []
const items = []
let lastOffset = options.offset ?? "-1"
let closed = false

try {
  const res = await stream({
    url: options.url,
    offset: options.offset,
    live: options.live,
    headers: options.headers ?? {},
    params: options.params ?? {},
  })
  await new Promise((resolve, reject) => {
    res.subscribeJson(async (batch) => {
      batches.push({
        count: batch.items.length,
        offset: batch.offset,
        upToDate: batch.upToDate,
        streamClosed: batch.streamClosed,
      })
      for (const item of batch.items) {
        items.push(item)
      }
      lastOffset = batch.offset
      closed = batch.streamClosed
      const enough = options.stopAfter !== undefined && items.length >= options.stopAfter
      const caughtUp = options.live === false && batch.upToDate
      if (batch.streamClosed || enough || caughtUp) {
        resolve()
      }
    })
    // Not `closed` resolving: the client marks the session closed as soon as it has
    // queued the last response, before the subscriber has seen it.
    res.closed.catch(reject)
  })
  res.cancel()
  process.stdout.write(JSON.stringify({ batches, items, offset: lastOffset, streamClosed: closed }))
} catch (error) {
  process.stdout.write(
    JSON.stringify({
      error: {
        name: error?.name,
        status: error?.status,
        code: error?.code,
        message: String(error?.message ?? error),
      },
    })
  )
}
process.exit(0)

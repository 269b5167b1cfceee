// Starts the fauxqs SQS emulator for idemq's SQS adapter tests, bound to
// loopback only (the fauxqs CLI binds 0.0.0.0, which this project's machines
// do not allow).
//
//   node start.mjs [--port N] [--host 127.0.0.1]
//
// --port 0 (the default) picks a free port. Once listening it prints one
// line, "FAUXQS_URL=http://127.0.0.1:PORT", which the Go tests read. It
// stops on SIGINT/SIGTERM and, unless --detached is given, when its standard
// input closes: the test process that started it holds the pipe, so the
// emulator never outlives it, even after a kill -9 of the test binary.
import { buildApp } from "fauxqs";

function arg(name, fallback) {
  const i = process.argv.indexOf(name);
  return i >= 0 && i + 1 < process.argv.length ? process.argv[i + 1] : fallback;
}

const host = arg("--host", "127.0.0.1");
const port = Number.parseInt(arg("--port", process.env.FAUXQS_PORT ?? "0"), 10);
const detached = process.argv.includes("--detached");
const verbose = process.argv.includes("--verbose");

if (!Number.isInteger(port) || port < 0 || port > 65535) {
  console.error(`start.mjs: --port ${arg("--port", "")} is not a port number`);
  process.exit(2);
}

const app = buildApp({ logger: verbose });
let address;
try {
  address = await app.listen({ port, host });
} catch (err) {
  console.error(`start.mjs: listen on ${host}:${port}: ${err.message}`);
  process.exit(1);
}
console.log(`FAUXQS_URL=${address}`);

let stopping = false;
async function stop() {
  if (stopping) return;
  stopping = true;
  try {
    await app.close();
  } finally {
    process.exit(0);
  }
}
process.on("SIGINT", stop);
process.on("SIGTERM", stop);
if (!detached) {
  process.stdin.on("end", stop);
  process.stdin.on("error", stop);
  process.stdin.resume();
}

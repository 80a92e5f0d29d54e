// node fetch.js URL FILE: one GET with Node's global fetch, as Node tools do.
const fs = require("node:fs");
const { Readable } = require("node:stream");
const { pipeline } = require("node:stream/promises");

const [url, file] = process.argv.slice(2);
fetch(url)
  .then((response) => {
    if (!response.ok) throw new Error(`status ${response.status}`);
    return pipeline(Readable.fromWeb(response.body), fs.createWriteStream(file));
  })
  .catch((error) => {
    console.error(error);
    process.exit(1);
  });

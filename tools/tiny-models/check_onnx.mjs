// Checks that ONNX Runtime (onnxruntime-node, the reference runtime of
// tools/golden) reproduces each tiny model's torch-logits.json from its
// onnx/model.onnx within 1e-4, every argmax equal: each pair alone, and the
// pairs of each sentence as one right-padded batch (pad id 1).
//
// Usage: ORT_NODE=tools/golden/node_modules/onnxruntime-node node check_onnx.mjs MODEL_DIR...
import fs from 'node:fs';
import path from 'node:path';
import { createRequire } from 'node:module';

const require = createRequire(import.meta.url);
const ort = require(path.resolve(process.env.ORT_NODE || 'tools/golden/node_modules/onnxruntime-node'));
const TOL = 1e-4;
const PAD = 1;

function feeds(rows) {
  const n = Math.max(...rows.map((r) => r.length));
  const ids = new BigInt64Array(rows.length * n).fill(BigInt(PAD));
  const mask = new BigInt64Array(rows.length * n);
  rows.forEach((r, i) => r.forEach((t, j) => {
    ids[i * n + j] = BigInt(t);
    mask[i * n + j] = 1n;
  }));
  return {
    input_ids: new ort.Tensor('int64', ids, [rows.length, n]),
    attention_mask: new ort.Tensor('int64', mask, [rows.length, n]),
  };
}

const argmax = (v) => v.indexOf(Math.max(...v));
let failed = false;
for (const dir of process.argv.slice(2)) {
  const ref = JSON.parse(fs.readFileSync(path.join(dir, 'torch-logits.json'), 'utf8'));
  const sess = await ort.InferenceSession.create(path.join(dir, 'onnx', 'model.onnx'));
  let worst = 0;
  let rows = 0;
  const check = (got, want, what) => {
    let d = 0;
    for (let k = 0; k < want.length; k++) d = Math.max(d, Math.abs(got[k] - want[k]));
    worst = Math.max(worst, d);
    if (argmax(Array.from(got)) !== argmax(want) || d > TOL) {
      console.error(`${dir} ${what}: got ${Array.from(got)} want ${want}`);
      failed = true;
    }
    rows++;
  };
  for (const enc of ['pair', 'joined']) {
    for (let s = 0; s < ref.sentences.length; s++) {
      const per = ref.ids[enc][s];
      for (let h = 0; h < per.length; h++) {
        const out = (await sess.run(feeds([per[h]]))).logits.data;
        check(out, ref.logits[enc][s][h], `${enc} sentence ${s} hypothesis ${h} alone`);
      }
      const out = (await sess.run(feeds(per))).logits.data;
      const c = ref.logits[enc][s][0].length;
      for (let h = 0; h < per.length; h++) {
        check(out.slice(h * c, (h + 1) * c), ref.logits[enc][s][h], `${enc} sentence ${s} hypothesis ${h} in a padded batch`);
      }
    }
  }
  console.log(`${dir}: ${rows} rows, largest difference ${worst.toExponential(2)}`);
}
process.exit(failed ? 1 : 0);

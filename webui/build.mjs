// Bundles the UI into one self-contained HTML page (script and styles inline) so the server has a
// single asset to embed, and writes it with a gzip copy: the server sends the gzip as it is to the
// browsers that accept it (all of them) and the plain page to the rest.
import { build } from 'esbuild';
import { readFileSync, writeFileSync, mkdirSync } from 'node:fs';
import { gzipSync, constants } from 'node:zlib';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));
const source = (name) => path.join(here, 'src', name);

const bundled = await build({
  entryPoints: [source('app.js')],
  bundle: true,
  minify: true,
  format: 'iife',
  target: ['es2022'],
  legalComments: 'none',
  write: false,
});
const script = bundled.outputFiles[0].text;
const styles = await build({ entryPoints: [source('style.css')], bundle: true, minify: true, write: false });
const css = styles.outputFiles[0].text;

// Inline script text must not close its own element.
if (/<\/script/i.test(script)) throw new Error('the bundle contains "</script": it cannot be inlined');
const html = readFileSync(source('index.html'), 'utf8')
  .replace('/*STYLE*/', () => css.trim())
  .replace('/*SCRIPT*/', () => script.trim());

const out = path.join(here, 'dist');
mkdirSync(out, { recursive: true });
writeFileSync(path.join(out, 'index.html'), html);
// Level 9 and no timestamp (Node writes none): the same sources give the same bytes.
const gz = gzipSync(html, { level: constants.Z_BEST_COMPRESSION });
writeFileSync(path.join(out, 'index.html.gz'), gz);
console.log(`webui/dist/index.html: ${html.length} bytes, ${gz.length} gzipped`);

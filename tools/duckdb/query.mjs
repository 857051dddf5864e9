// Runs SQL statements in an in-memory DuckDB and prints the rows of the
// last one as JSON, one object per line. The Go tests of `scorer score`
// use it as the independent engine that writes the seed-shaped Parquet
// they feed the scorer and reads back the Parquet the scorer writes.
//
// Usage: node query.mjs 'STATEMENT;' ['STATEMENT;' ...]   (from anywhere)
import { DuckDBInstance } from '@duckdb/node-api';

const statements = process.argv.slice(2);
if (statements.length === 0) {
  console.error('usage: node query.mjs SQL [SQL ...]');
  process.exit(2);
}
const db = await DuckDBInstance.create(':memory:');
const conn = await db.connect();
let last;
for (const sql of statements) last = await conn.runAndReadAll(sql);
for (const row of last.getRowObjectsJson()) process.stdout.write(JSON.stringify(row) + '\n');

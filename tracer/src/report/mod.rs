//! Readers of the aggregate: the text summary and NDJSON.

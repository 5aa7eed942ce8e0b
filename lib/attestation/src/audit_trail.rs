//! The hash chain over one process's audit records, and its check.
//!
//! Every audit record a process writes carries `seq` (1, 2, … since the process started) and
//! `prev`, the SHA-256 of the previous record. A process's first line is a chain-start record
//! (`chain_start`: which process, its pid, when; `seq` 0, `prev` all zeros), so each start is
//! recorded and a chain can be told from the next. A record is hashed in its canonical form:
//! compact JSON with every object's keys sorted, which is also the form it is written in, so the
//! check ([`verify`]) can hash a record read back from a text log line or from the object
//! embedded in a JSON log line alike.
//!
//! What the chain shows: a record changed, removed or inserted after it was written breaks it
//! at the next record; what it cannot show is records cut off the end of a log (nothing follows
//! them) or a whole log replaced by one rewritten from its start. Shipping the lines off the
//! machine as they are written closes both.

use std::sync::Mutex;

use serde_json::{Map, Value};

/// `prev` of a chain-start record.
pub const GENESIS: &str = "0000000000000000000000000000000000000000000000000000000000000000";

/// The canonical form of a record: compact JSON, object keys sorted at every level.
pub fn canonical(record: &Value) -> String {
    fn sorted(value: &Value) -> Value {
        match value {
            Value::Object(map) => {
                let mut keys: Vec<&String> = map.keys().collect();
                keys.sort();
                let mut out = Map::new();
                for key in keys {
                    out.insert(key.clone(), sorted(&map[key]));
                }
                Value::Object(out)
            }
            Value::Array(items) => Value::Array(items.iter().map(sorted).collect()),
            other => other.clone(),
        }
    }
    sorted(record).to_string()
}

/// SHA-256 of a record's canonical form, lowercase hex.
pub fn digest(record: &Value) -> String {
    digest_of(&canonical(record))
}

fn digest_of(canonical: &str) -> String {
    hex::encode(aws_lc_rs::digest::digest(
        &aws_lc_rs::digest::SHA256,
        canonical.as_bytes(),
    ))
}

/// One process's chain: hands out `seq` and `prev` in the order records are sealed. Sealing
/// and writing a record must happen under one lock (the caller's [`Chain::seal`] closure), so the
/// lines appear in the order they chain.
#[derive(Debug)]
pub struct Chain {
    state: Mutex<Link>,
}

#[derive(Debug)]
struct Link {
    seq: u64,
    prev: String,
}

impl Chain {
    /// A new chain for `process`, with its start record (already sealed: `seq` 0, `prev`
    /// [`GENESIS`]) to be written first.
    pub fn start(process: &str) -> (Chain, Value) {
        let record = serde_json::json!({
            "chain_start": {
                "process": process,
                "pid": std::process::id(),
                "time": humantime::format_rfc3339_millis(std::time::SystemTime::now()).to_string(),
            },
            "seq": 0,
            "prev": GENESIS,
        });
        let chain = Chain {
            state: Mutex::new(Link {
                seq: 0,
                prev: digest(&record),
            }),
        };
        (chain, record)
    }

    /// Seals `record` (a JSON object) as the next link, sets its `seq` and `prev`, and calls
    /// `write` with it and its [`canonical`] form (the text its digest is over, made once)
    /// while no other record can be sealed, so the order written is the order chained.
    pub fn seal<T>(&self, mut record: Value, write: impl FnOnce(&Value, &str) -> T) -> T {
        let mut link = self
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        link.seq += 1;
        if let Value::Object(map) = &mut record {
            map.insert("seq".to_owned(), link.seq.into());
            map.insert("prev".to_owned(), link.prev.clone().into());
        }
        let text = canonical(&record);
        link.prev = digest_of(&text);
        write(&record, &text)
    }
}

/// The audit record a log line carries, if any: a text line's JSON after `audit: `, or the
/// `audit` object of a JSON line whose target is `audit`.
pub fn record_in_line(line: &str) -> Option<Value> {
    if let Ok(Value::Object(map)) = serde_json::from_str::<Value>(line) {
        if map.get("target").and_then(Value::as_str) == Some(crate::audit::TARGET) {
            return map.get("audit").filter(|v| v.is_object()).cloned();
        }
        return None;
    }
    let start = line.find(" audit: {")? + " audit: ".len();
    serde_json::from_str::<Value>(line[start..].trim_end())
        .ok()
        .filter(Value::is_object)
}

/// One intact chain in a log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChainSummary {
    /// The start record's `chain_start` (process, pid, time); `None` when the log begins
    /// mid-chain (its start was rotated away), which is checked from its first record on.
    pub start: Option<Value>,
    /// 1-based line of its first record.
    pub first_line: usize,
    /// Records after the start record.
    pub records: u64,
}

/// Where a chain breaks.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("line {line}: {reason}")]
pub struct Break {
    /// 1-based line of the first record that does not follow from the one before it.
    pub line: usize,
    pub reason: String,
}

/// Checks every chain in a log's lines (other lines are skipped). Returns the chains, or the
/// first break.
pub fn verify<'a>(lines: impl IntoIterator<Item = &'a str>) -> Result<Vec<ChainSummary>, Break> {
    let mut chains: Vec<ChainSummary> = Vec::new();
    // The previous record's (line, seq, digest) in the current chain.
    let mut last: Option<(usize, u64, String)> = None;
    for (index, line) in lines.into_iter().enumerate() {
        let number = index + 1;
        let Some(record) = record_in_line(line) else {
            continue;
        };
        let broken = |reason: String| Break {
            line: number,
            reason,
        };
        let seq = record
            .get("seq")
            .and_then(Value::as_u64)
            .ok_or_else(|| broken("an audit record without seq (not chained)".to_owned()))?;
        let prev = record
            .get("prev")
            .and_then(Value::as_str)
            .ok_or_else(|| broken("an audit record without prev (not chained)".to_owned()))?;
        if let Some(start) = record.get("chain_start") {
            if seq != 0 || prev != GENESIS {
                return Err(broken(
                    "a chain-start record must have seq 0 and prev all zeros".to_owned(),
                ));
            }
            chains.push(ChainSummary {
                start: Some(start.clone()),
                first_line: number,
                records: 0,
            });
        } else {
            match &last {
                Some((last_line, last_seq, last_digest)) => {
                    if seq != last_seq + 1 {
                        return Err(broken(format!(
                            "seq {seq} follows seq {last_seq} (line {last_line}): a record is missing or out of place"
                        )));
                    }
                    if prev != last_digest {
                        return Err(broken(format!(
                            "prev is not the SHA-256 of the record at line {last_line}: that record was altered, or one was removed between them"
                        )));
                    }
                }
                None => chains.push(ChainSummary {
                    start: None,
                    first_line: number,
                    records: 0,
                }),
            }
            if let Some(chain) = chains.last_mut() {
                chain.records += 1;
            }
        }
        last = Some((number, seq, digest(&record)));
    }
    Ok(chains)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn text_line(record: &Value) -> String {
        format!(
            "2026-11-28T07:00:00.000000Z  WARN audit: {}",
            canonical(record)
        )
    }

    fn log(records: usize) -> Vec<String> {
        let (chain, start) = Chain::start("attest-proxy");
        let mut lines = vec![
            text_line(&start),
            "2026-11-28T07:00:00.1Z  INFO attest_proxy: listening".to_owned(),
        ];
        for i in 0..records {
            let record =
                serde_json::json!({"result": "accepted", "peer": format!("10.0.0.{i}:4000")});
            // The text `seal` hands over is what the digest was made over.
            lines.push(chain.seal(record, |_, canonical| {
                format!("2026-11-28T07:00:00.000000Z  WARN audit: {canonical}")
            }));
        }
        lines
    }

    fn check(lines: &[String]) -> Result<Vec<ChainSummary>, Break> {
        verify(lines.iter().map(String::as_str))
    }

    #[test]
    fn an_untouched_log_verifies_chain_by_chain() {
        let mut lines = log(3);
        lines.extend(log(2));
        let chains = check(&lines).unwrap();
        assert_eq!(chains.len(), 2);
        assert_eq!((chains[0].first_line, chains[0].records), (1, 3));
        assert_eq!((chains[1].first_line, chains[1].records), (6, 2));
        assert_eq!(chains[0].start.as_ref().unwrap()["process"], "attest-proxy");
    }

    #[test]
    fn an_altered_a_removed_and_an_inserted_record_break_the_chain_where_they_are() {
        let lines = log(4);
        let mut altered = lines.clone();
        altered[3] = altered[3].replace("10.0.0.1", "10.0.0.9");
        let error = check(&altered).unwrap_err();
        assert_eq!(error.line, 5, "{error}");
        assert!(error.reason.contains("line 4"), "{error}");

        let mut removed = lines.clone();
        removed.remove(3);
        let error = check(&removed).unwrap_err();
        assert_eq!(error.line, 4, "{error}");
        assert!(error.reason.contains("seq 3 follows seq 1"), "{error}");

        let mut inserted = lines.clone();
        inserted.insert(3, lines[2].clone());
        assert_eq!(check(&inserted).unwrap_err().line, 4);

        let mut unchained = lines.clone();
        unchained.push(text_line(&serde_json::json!({"result": "accepted"})));
        assert!(
            check(&unchained)
                .unwrap_err()
                .reason
                .contains("without seq")
        );
    }

    #[test]
    fn a_log_that_begins_mid_chain_is_checked_from_its_first_record() {
        let lines = log(3);
        let chains = check(&lines[3..]).unwrap();
        assert_eq!(chains.len(), 1);
        assert_eq!(chains[0].start, None);
        assert_eq!(chains[0].records, 2);
    }

    #[test]
    fn json_log_lines_carry_the_record_as_an_object() {
        let (chain, start) = Chain::start("join-client");
        let json_line = |record: &Value| {
            serde_json::json!({"timestamp": "t", "level": "WARN", "target": "audit", "audit": record})
                .to_string()
        };
        let lines = vec![
            json_line(&start),
            chain.seal(
                serde_json::json!({"b": 1, "a": [{"y": 2, "x": 1}]}),
                |record, _| json_line(record),
            ),
        ];
        assert_eq!(check(&lines).unwrap()[0].records, 1);
        let record = record_in_line(&lines[1]).unwrap();
        assert_eq!(record["seq"], 1);
        // Key order does not matter to the digest.
        assert_eq!(
            digest(&record),
            digest(&serde_json::from_str(&canonical(&record)).unwrap())
        );
    }
}

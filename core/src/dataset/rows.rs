//! A file's rows as JSON objects: the lines of a JSONL file, or the rows of a
//! Parquet file (by its `.parquet` extension).
//!
//! JSONL is read as a stream: a line longer than the cap
//! ([`MAX_LINE_BYTES`] by default) is refused when the cap is passed, without
//! reading the rest of it, and bytes that are not UTF-8 are refused with their
//! line and column. Blank lines are skipped. Parquet rows come from the
//! parquet crate's record reader (no Arrow), with nested groups as objects,
//! lists as arrays and maps as objects; a binary value must be UTF-8 text.
//! A file without a single row is an error.
use super::{DatasetError, Location};
use parquet::file::reader::{FileReader, SerializedFileReader};
use parquet::record::Field;
use serde_json::{Map, Number, Value};
use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::Path;

/// The longest JSONL line a file may have: 16 MiB. A longer one is refused
/// (a task or a conversation that long is a mistake, and reading it whole
/// would hold it all in memory).
pub const MAX_LINE_BYTES: usize = 16 << 20;

/// How a file's rows are stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// One JSON object per line.
    Jsonl,
    /// Apache Parquet.
    Parquet,
}

impl Format {
    /// By extension: `.parquet` (or `.pq`) is Parquet, anything else JSONL.
    pub fn of(path: &Path) -> Format {
        match path.extension().and_then(|e| e.to_str()).map(str::to_ascii_lowercase).as_deref() {
            Some("parquet" | "pq") => Format::Parquet,
            _ => Format::Jsonl,
        }
    }
}

/// Calls `each` with every row of the file at `path` (JSONL or Parquet, see
/// [`Format::of`]) and its location; an `Err` from `each` becomes an error
/// at that row. Returns the number of rows; a file with none is an error.
pub fn read_rows(
    path: &Path,
    max_line_bytes: usize,
    each: impl FnMut(Location, Map<String, Value>) -> Result<(), String>,
) -> Result<usize, DatasetError> {
    let name = path.display().to_string();
    let file = File::open(path).map_err(|error| DatasetError::Io { path: name.clone(), error })?;
    match Format::of(path) {
        Format::Jsonl => read_jsonl(BufReader::new(file), &name, max_line_bytes, each),
        Format::Parquet => read_parquet(file, &name, each),
    }
}

/// `rows`, or the error of a file without any.
fn some_rows(file: &str, rows: usize) -> Result<usize, DatasetError> {
    if rows == 0 {
        return Err(DatasetError::File { file: file.to_string(), message: "no rows (the file is empty)".into() });
    }
    Ok(rows)
}

/// What [`next_line`] found.
enum Line {
    End,
    Read,
    TooLong,
}

/// Reads the next line into `buf` (without its `\n`), but never more than
/// `cap` bytes of it.
fn next_line(r: &mut impl BufRead, buf: &mut Vec<u8>, cap: usize) -> std::io::Result<Line> {
    buf.clear();
    loop {
        let avail = r.fill_buf()?;
        if avail.is_empty() {
            return Ok(if buf.is_empty() { Line::End } else { Line::Read });
        }
        let (take, done) = match avail.iter().position(|&b| b == b'\n') {
            Some(i) => (i, true),
            None => (avail.len(), false),
        };
        if buf.len() + take > cap {
            return Ok(Line::TooLong);
        }
        buf.extend_from_slice(&avail[..take]);
        r.consume(take + usize::from(done));
        if done {
            return Ok(Line::Read);
        }
    }
}

/// The rows of JSONL text read from `r` (`file` names it in errors); none is an error.
pub fn read_jsonl(
    mut r: impl BufRead,
    file: &str,
    max_line_bytes: usize,
    mut each: impl FnMut(Location, Map<String, Value>) -> Result<(), String>,
) -> Result<usize, DatasetError> {
    let mut buf = Vec::new();
    let mut rows = 0;
    for n in 1.. {
        let at = Location::Line(n);
        let err = |m: String| DatasetError::at(file, at, m);
        match next_line(&mut r, &mut buf, max_line_bytes) {
            Ok(Line::End) => break,
            Ok(Line::Read) => {}
            Ok(Line::TooLong) => {
                return Err(err(format!("line longer than {max_line_bytes} bytes, the cap on a line (one row per line)")))
            }
            Err(error) => return Err(DatasetError::Io { path: format!("{file}:{n}"), error }),
        }
        let mut bytes = buf.as_slice();
        if n == 1 {
            bytes = bytes.strip_prefix("\u{feff}".as_bytes()).unwrap_or(bytes);
        }
        let text = std::str::from_utf8(bytes).map_err(|e| {
            err(format!("not UTF-8: byte {:#04x} at column {}", bytes[e.valid_up_to()], e.valid_up_to() + 1))
        })?;
        let text = text.strip_suffix('\r').unwrap_or(text);
        if text.trim().is_empty() {
            continue;
        }
        let obj = match serde_json::from_str::<Value>(text) {
            Ok(Value::Object(obj)) => obj,
            Ok(other) => return Err(err(format!("expected a JSON object (one row per line), got {}", describe(&other)))),
            Err(e) => return Err(err(format!("invalid JSON: {e}"))),
        };
        each(at, obj).map_err(err)?;
        rows += 1;
    }
    some_rows(file, rows)
}

/// The rows of a Parquet file.
fn read_parquet(
    file: File,
    name: &str,
    mut each: impl FnMut(Location, Map<String, Value>) -> Result<(), String>,
) -> Result<usize, DatasetError> {
    let reader = SerializedFileReader::new(file)
        .map_err(|e| DatasetError::File { file: name.to_string(), message: format!("not a Parquet file: {e}") })?;
    let iter = reader
        .get_row_iter(None)
        .map_err(|e| DatasetError::File { file: name.to_string(), message: format!("cannot read its rows: {e}") })?;
    let mut rows = 0;
    for (i, row) in iter.enumerate() {
        let at = Location::Row(i + 1);
        let err = |m: String| DatasetError::at(name, at, m);
        let row = row.map_err(|e| err(format!("cannot read the row: {}", clip(&e.to_string(), 300))))?;
        let mut obj = Map::new();
        for (column, field) in row.get_column_iter() {
            obj.insert(column.clone(), field_value(field).map_err(|m| err(format!("column \"{column}\": {m}")))?);
        }
        each(at, obj).map_err(err)?;
        rows += 1;
    }
    some_rows(name, rows)
}

/// A Parquet value as JSON: numbers, strings, booleans and null as such,
/// groups and maps as objects, lists as arrays, NaN and infinities as null,
/// decimals, dates and times as their text.
fn field_value(f: &Field) -> Result<Value, String> {
    let float = |x: f64| Number::from_f64(x).map_or(Value::Null, Value::Number);
    Ok(match f {
        Field::Null => Value::Null,
        Field::Bool(b) => Value::Bool(*b),
        Field::Byte(n) => Value::from(*n),
        Field::Short(n) => Value::from(*n),
        Field::Int(n) => Value::from(*n),
        Field::Long(n) => Value::from(*n),
        Field::UByte(n) => Value::from(*n),
        Field::UShort(n) => Value::from(*n),
        Field::UInt(n) => Value::from(*n),
        Field::ULong(n) => Value::from(*n),
        Field::Float16(x) => float(f64::from(*x)),
        Field::Float(x) => float(f64::from(*x)),
        Field::Double(x) => float(*x),
        Field::Str(s) => Value::String(s.clone()),
        Field::Bytes(b) => match std::str::from_utf8(b.data()) {
            Ok(s) => Value::String(s.to_string()),
            Err(e) => return Err(format!("a binary value that is not UTF-8 text (byte {} of {})", e.valid_up_to() + 1, b.len())),
        },
        Field::Group(row) => {
            let mut obj = Map::new();
            for (k, v) in row.get_column_iter() {
                obj.insert(k.clone(), field_value(v).map_err(|m| format!("\"{k}\": {m}"))?);
            }
            Value::Object(obj)
        }
        Field::ListInternal(list) => Value::Array(list.elements().iter().map(field_value).collect::<Result<_, _>>()?),
        Field::MapInternal(map) => {
            let mut obj = Map::new();
            for (k, v) in map.entries() {
                let key = match field_value(k)? {
                    Value::String(s) => s,
                    other => other.to_string(),
                };
                obj.insert(key, field_value(v)?);
            }
            Value::Object(obj)
        }
        other @ (Field::Decimal(_)
        | Field::Date(_)
        | Field::TimeMillis(_)
        | Field::TimeMicros(_)
        | Field::TimestampMillis(_)
        | Field::TimestampMicros(_)) => Value::String(other.to_string().trim_matches('"').to_string()),
    })
}

pub(crate) use crate::tools::schema::describe;

/// `s` cut to at most `max` bytes (at a character boundary), with `…` when cut.
pub(crate) fn clip(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

// Rows out of gacctl: one schema of named columns, written as an aligned
// table for people, as CSV (RFC 4180, a header line, LF line ends) for
// spreadsheets and pandas, or as JSON Lines (one object per row) for
// programs. CSV and JSON Lines carry exact values: every double is written
// in the shortest form that reads back to the same bits, times as integer
// nanoseconds since the Unix epoch. The table shows a cell's display text
// (6 significant digits, times in UTC, ages), and "-" for an absent value.
//
// The table writer buffers rows until Flush() to align them; once a column
// has been printed at a width it keeps at least that width, so a stream of
// pages stays aligned as far as its values allow. CSV and JSON Lines rows
// are written as they come. Nothing, not even a header, is written before
// the first row or Flush(), so a command that fails first writes nothing.
//
// Thread safety: a RowWriter is used by one thread; the functions are pure.
#ifndef GAC_CLI_FORMAT_H_
#define GAC_CLI_FORMAT_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "gac/base/status.h"

namespace gac::cli {

enum class Format { kTable, kCsv, kJsonl };

// "table", "csv", "jsonl"; InvalidArgument for anything else.
base::StatusOr<Format> ParseFormat(const std::string& name);
const char* FormatName(Format format);

// One value of a row: absent, text, an integer, a double or a boolean, with
// an optional display text that only the table shows (a time in UTC for a
// nanosecond count, an age).
class Cell {
 public:
  enum class Kind { kNull, kText, kInt, kReal, kBool };

  Cell() = default;  // absent
  static Cell Text(std::string text);
  static Cell Int(std::int64_t value);
  static Cell Real(double value);  // a non-finite value is written as absent
  static Cell Bool(bool value);
  // Integer nanoseconds since the Unix epoch, shown as a UTC time (0: "-").
  static Cell TimeNs(std::int64_t ns);
  static Cell Optional(const std::optional<double>& value) { return value ? Real(*value) : Cell(); }

  // The same value with `display` shown in the table instead.
  Cell WithDisplay(std::string display) &&;

  Kind kind() const { return kind_; }
  // The exact text (CSV, JSON number or string contents); "" when absent.
  const std::string& exact() const { return exact_; }
  // What the table shows.
  std::string Display() const;

 private:
  Kind kind_ = Kind::kNull;
  std::string exact_;
  std::optional<std::string> display_;
};

struct Column {
  std::string name;          // CSV header and JSON key
  std::string table_header;  // "" = the name in upper case
  bool align_right = false;  // numbers
  std::size_t min_width = 0;  // the table's narrowest width (steady columns when following)
};

// Writes rows of `columns` to an output stream.
class RowWriter {
 public:
  // `out` must outlive the writer.
  static std::unique_ptr<RowWriter> Create(Format format, std::ostream* out, std::vector<Column> columns);
  virtual ~RowWriter() = default;

  // REQUIRES: row.size() == the number of columns. `extra` are further
  // key/value pairs that only JSON Lines writes (after the columns); the
  // other formats ignore them.
  virtual void Add(std::vector<Cell> row, std::vector<std::pair<std::string, Cell>> extra = {}) = 0;
  // Writes what is buffered (the header first, once) and flushes the stream.
  virtual void Flush() = 0;
};

// The shortest decimal text that reads back as exactly `value` ("0.1",
// "1e-05", "12345678"); "nan" / "inf" / "-inf" for non-finite values.
std::string FormatExact(double value);
// `value` with `digits` significant digits, as printf's %g.
std::string FormatDisplay(double value, int digits = 6);
// "2024-05-01T12:00:00.123Z" (milliseconds, UTC).
std::string FormatTimeUtc(std::int64_t ns);
// A duration in words for people: "850ms", "42s", "3m05s", "2h07m", "3d04h".
// Negative durations (clocks apart) read as "0s".
std::string FormatAge(std::int64_t ns);

// CSV field: quoted (with doubled quotes) when it holds a comma, a quote, a
// line break, or leading or trailing spaces.
std::string CsvField(const std::string& text);
// A JSON string literal, quotes included; control characters escaped.
std::string JsonString(const std::string& text);

}  // namespace gac::cli

#endif  // GAC_CLI_FORMAT_H_

#include "gac/cli/format.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <ctime>

namespace gac::cli {

base::StatusOr<Format> ParseFormat(const std::string& name) {
  if (name == "table") return Format::kTable;
  if (name == "csv") return Format::kCsv;
  if (name == "jsonl") return Format::kJsonl;
  return base::Status::InvalidArgument("unknown format '" + name + "' (expected table, csv or jsonl)");
}

const char* FormatName(Format format) {
  switch (format) {
    case Format::kTable: return "table";
    case Format::kCsv: return "csv";
    case Format::kJsonl: return "jsonl";
  }
  return "table";
}

Cell Cell::Text(std::string text) {
  Cell c;
  c.kind_ = Kind::kText;
  c.exact_ = std::move(text);
  return c;
}

Cell Cell::Int(std::int64_t value) {
  Cell c;
  c.kind_ = Kind::kInt;
  c.exact_ = std::to_string(value);
  return c;
}

Cell Cell::Real(double value) {
  if (!std::isfinite(value)) return Cell();
  Cell c;
  c.kind_ = Kind::kReal;
  c.exact_ = FormatExact(value);
  c.display_ = FormatDisplay(value);
  return c;
}

Cell Cell::Bool(bool value) {
  Cell c;
  c.kind_ = Kind::kBool;
  c.exact_ = value ? "true" : "false";
  return c;
}

Cell Cell::TimeNs(std::int64_t ns) {
  Cell c = Int(ns);
  c.display_ = ns == 0 ? "-" : FormatTimeUtc(ns);
  return c;
}

Cell Cell::WithDisplay(std::string display) && {
  display_ = std::move(display);
  return std::move(*this);
}

std::string Cell::Display() const {
  if (display_) return *display_;
  if (kind_ == Kind::kNull) return "-";
  return exact_;
}

namespace {

class TableWriter : public RowWriter {
 public:
  TableWriter(std::ostream* out, std::vector<Column> columns) : out_(out), columns_(std::move(columns)) {
    widths_.resize(columns_.size(), 0);
    for (std::size_t i = 0; i < columns_.size(); ++i) widths_[i] = std::max(Header(i).size(), columns_[i].min_width);
  }

  void Add(std::vector<Cell> row, std::vector<std::pair<std::string, Cell>>) override {
    std::vector<std::string> texts;
    texts.reserve(row.size());
    for (std::size_t i = 0; i < row.size(); ++i) {
      texts.push_back(row[i].Display());
      widths_[i] = std::max(widths_[i], texts.back().size());
    }
    rows_.push_back(std::move(texts));
  }

  void Flush() override {
    if (!header_written_) {
      std::vector<std::string> header;
      for (std::size_t i = 0; i < columns_.size(); ++i) header.push_back(Header(i));
      WriteLine(header);
      header_written_ = true;
    }
    for (const auto& row : rows_) WriteLine(row);
    rows_.clear();
    out_->flush();
  }

 private:
  std::string Header(std::size_t i) const {
    if (!columns_[i].table_header.empty()) return columns_[i].table_header;
    std::string h = columns_[i].name;
    for (char& ch : h) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
    return h;
  }

  void WriteLine(const std::vector<std::string>& cells) {
    std::string line;
    for (std::size_t i = 0; i < cells.size(); ++i) {
      const bool last = i + 1 == cells.size();
      const std::size_t pad = widths_[i] - std::min(widths_[i], cells[i].size());
      if (columns_[i].align_right) line.append(pad, ' ');
      line += cells[i];
      if (!columns_[i].align_right && !last) line.append(pad, ' ');
      if (!last) line += "  ";
    }
    // No trailing blanks (a right-aligned last column has none either).
    while (!line.empty() && line.back() == ' ') line.pop_back();
    *out_ << line << '\n';
  }

  std::ostream* out_;
  std::vector<Column> columns_;
  std::vector<std::size_t> widths_;
  std::vector<std::vector<std::string>> rows_;
  bool header_written_ = false;
};

class CsvWriter : public RowWriter {
 public:
  CsvWriter(std::ostream* out, const std::vector<Column>& columns) : out_(out) {
    for (std::size_t i = 0; i < columns.size(); ++i) {
      if (i > 0) header_ += ',';
      header_ += CsvField(columns[i].name);
    }
  }

  void Add(std::vector<Cell> row, std::vector<std::pair<std::string, Cell>>) override {
    WriteHeader();
    std::string line;
    for (std::size_t i = 0; i < row.size(); ++i) {
      if (i > 0) line += ',';
      line += CsvField(row[i].exact());
    }
    *out_ << line << '\n';
  }

  void Flush() override {
    WriteHeader();
    out_->flush();
  }

 private:
  // The header goes out with the first row or flush, so that a command that
  // fails before its first answer writes nothing.
  void WriteHeader() {
    if (header_written_) return;
    *out_ << header_ << '\n';
    header_written_ = true;
  }

  std::ostream* out_;
  std::string header_;
  bool header_written_ = false;
};

class JsonlWriter : public RowWriter {
 public:
  JsonlWriter(std::ostream* out, std::vector<Column> columns) : out_(out), columns_(std::move(columns)) {}

  void Add(std::vector<Cell> row, std::vector<std::pair<std::string, Cell>> extra) override {
    std::string line = "{";
    bool first = true;
    auto append = [&](const std::string& key, const Cell& cell) {
      if (!first) line += ',';
      first = false;
      line += JsonString(key);
      line += ':';
      switch (cell.kind()) {
        case Cell::Kind::kNull: line += "null"; break;
        case Cell::Kind::kText: line += JsonString(cell.exact()); break;
        default: line += cell.exact(); break;
      }
    };
    for (std::size_t i = 0; i < row.size(); ++i) append(columns_[i].name, row[i]);
    for (const auto& [key, cell] : extra) append(key, cell);
    line += '}';
    *out_ << line << '\n';
  }

  void Flush() override { out_->flush(); }

 private:
  std::ostream* out_;
  std::vector<Column> columns_;
};

}  // namespace

std::unique_ptr<RowWriter> RowWriter::Create(Format format, std::ostream* out, std::vector<Column> columns) {
  switch (format) {
    case Format::kCsv: return std::make_unique<CsvWriter>(out, columns);
    case Format::kJsonl: return std::make_unique<JsonlWriter>(out, std::move(columns));
    case Format::kTable: break;
  }
  return std::make_unique<TableWriter>(out, std::move(columns));
}

std::string FormatExact(double value) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  char buf[64];
  const auto result = std::to_chars(buf, buf + sizeof buf, value);
  return std::string(buf, result.ptr);
}

std::string FormatDisplay(double value, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*g", digits, value);
  return buf;
}

std::string FormatTimeUtc(std::int64_t ns) {
  // Floor division, so that times before 1970 keep a positive millisecond part.
  std::int64_t seconds = ns / 1000000000;
  std::int64_t rest = ns % 1000000000;
  if (rest < 0) {
    rest += 1000000000;
    --seconds;
  }
  const std::time_t t = static_cast<std::time_t>(seconds);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[64];
  std::snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900, tm.tm_mon + 1,
                tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, static_cast<int>(rest / 1000000));
  return buf;
}

std::string FormatAge(std::int64_t ns) {
  if (ns < 0) ns = 0;
  const std::int64_t ms = ns / 1000000;
  const std::int64_t s = ns / 1000000000;
  char buf[64];
  if (s < 1) {
    std::snprintf(buf, sizeof buf, "%lldms", static_cast<long long>(ms));
  } else if (s < 60) {
    std::snprintf(buf, sizeof buf, "%llds", static_cast<long long>(s));
  } else if (s < 3600) {
    std::snprintf(buf, sizeof buf, "%lldm%02llds", static_cast<long long>(s / 60), static_cast<long long>(s % 60));
  } else if (s < 86400) {
    std::snprintf(buf, sizeof buf, "%lldh%02lldm", static_cast<long long>(s / 3600),
                  static_cast<long long>(s % 3600 / 60));
  } else {
    std::snprintf(buf, sizeof buf, "%lldd%02lldh", static_cast<long long>(s / 86400),
                  static_cast<long long>(s % 86400 / 3600));
  }
  return buf;
}

std::string CsvField(const std::string& text) {
  const bool quote = text.find_first_of(",\"\r\n") != std::string::npos ||
                     (!text.empty() && (text.front() == ' ' || text.back() == ' '));
  if (!quote) return text;
  std::string out = "\"";
  for (char ch : text) {
    if (ch == '"') out += '"';
    out += ch;
  }
  out += '"';
  return out;
}

std::string JsonString(const std::string& text) {
  std::string out = "\"";
  for (char ch : text) {
    const unsigned char u = static_cast<unsigned char>(ch);
    switch (ch) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (u < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", u);
          out += buf;
        } else {
          out += ch;
        }
    }
  }
  out += '"';
  return out;
}

}  // namespace gac::cli

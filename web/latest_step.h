// The page's "Latest step" card (index.html, app.js): which step record
// fields it shows, each with its label, its decimals and its place down the
// card, keyed by the field's wire name (gac/proto/record_schema.h). gacd
// serves them with the fields at GET /api/v1/fields (`page`), and app.js
// puts each row by its place between the card's own rows, which index.html
// holds at the kPlace* places below. tests/server/http_api_test.cc says
// why each other field is not on the card.
//
// Thread safety: constant data.
#ifndef GAC_WEB_LATEST_STEP_H_
#define GAC_WEB_LATEST_STEP_H_

#include <string_view>

namespace gac::web {

struct LatestStepRow {
  const char* field;  // the record field's wire name
  const char* label;  // UTF-8
  int digits;         // decimals shown; -1: 4 significant digits
  int place;          // ascending down the card
};

inline constexpr LatestStepRow kLatestStepRows[] = {
    {"step", "step", 0, 10},
    {"cosine", "c\u209c", 4, 20},
    {"cosine_after", "cosine after", 4, 35},
    {"regime", "regime", 0, 40},
    {"grad_norm", "\u2016g\u2016", -1, 60},
    {"ref_norm", "\u2016p\u2016", -1, 65},
    {"grad_norm_z", "z of \u2016g\u2016", 2, 70},
    {"staleness", "staleness", 0, 80},
    // The policy-health signals (the run view charts ESS and the clipped fractions).
    {"ess_token", "ESS", 4, 82},
    {"clip_fraction_low", "clipped low", 4, 83},
    {"clip_fraction_high", "clipped high", 4, 84},
    {"kl_k3", "KL (k3)", -1, 85},
    {"entropy_mean", "entropy", -1, 86},
};

// The places of the card's own rows (index.html's data-place): m_t,
// "decided with" and "last report".
inline constexpr int kPlaceWindowMean = 30;
inline constexpr int kPlaceDecidedWith = 90;
inline constexpr int kPlaceLastReport = 100;

// The card's row of the field named `field`, or nullptr when it is not on
// the card.
inline const LatestStepRow* FindLatestStepRow(std::string_view field) {
  for (const LatestStepRow& row : kLatestStepRows) {
    if (field == row.field) return &row;
  }
  return nullptr;
}

}  // namespace gac::web

#endif  // GAC_WEB_LATEST_STEP_H_

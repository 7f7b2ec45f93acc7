// OLMo-core's skip-step rule (olmo_core.optim.SkipStepOptimizer, ai2-olmo-core
// 3.0.0), written here from its code so that the example trainer can run it
// in place of gac's spike guard: every step's loss and gradient norm enter a
// history of the last `window` + 1 steps, the skipped ones too; once it holds
// max(2, window / 2) values, the step is skipped when its loss or its norm is
// more than `sigma` sample standard deviations above the mean of the steps
// before it. examples/grpo/spikes.py checks this against the class itself on
// the runs that used it.
#ifndef GAC_EXAMPLES_GRPO_OLMO_SKIP_H_
#define GAC_EXAMPLES_GRPO_OLMO_SKIP_H_

#include <algorithm>
#include <cmath>
#include <deque>

namespace gac::grpo {

class OlmoSkipRule {
 public:
  OlmoSkipRule(double sigma, int window) : sigma_(sigma), window_(window) {}

  // Records the step's loss and norm, then says whether to skip it.
  bool Skip(double loss, double grad_norm) {
    Push(losses_, loss);
    Push(norms_, grad_norm);
    if (static_cast<int>(losses_.size()) < std::max(2, window_ / 2)) return false;
    return Above(losses_) || Above(norms_);
  }

 private:
  void Push(std::deque<double>& d, double x) const {
    d.push_back(x);
    while (static_cast<int>(d.size()) > window_ + 1) d.pop_front();
  }
  // The newest value against the mean and sample sd of the ones before it.
  bool Above(const std::deque<double>& d) const {
    const double n = static_cast<double>(d.size() - 1);
    double mean = 0.0;
    for (std::size_t i = 0; i + 1 < d.size(); ++i) mean += d[i];
    mean /= n;
    double ss = 0.0;
    for (std::size_t i = 0; i + 1 < d.size(); ++i) ss += (d[i] - mean) * (d[i] - mean);
    const double sd = std::sqrt(ss / (n - 1.0));
    return !(d.back() - mean <= sigma_ * sd);
  }

  double sigma_;
  int window_;
  std::deque<double> losses_, norms_;
};

}  // namespace gac::grpo

#endif  // GAC_EXAMPLES_GRPO_OLMO_SKIP_H_

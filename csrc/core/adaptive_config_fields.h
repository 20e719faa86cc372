// The one table of AdaptiveConfig's fields. Each row is
//   X(type, name, default, bounds, doc)
// and everything else derives from it: the struct's members and defaults
// (adaptive_config.h), validate() and its messages (adaptive_config.cpp), the
// Python constructor, read-only properties, to_dict() and
// adaptive_config_schema() (csrc/python/bind_core.cpp), and config.py's
// schema. A new field is one row here (plus the policy code that reads it).
//
// type: PolicyKind / AcceptanceModel (a choice, named by EnumNames<>),
// std::vector<int> (step counts), TreeShapes (tree shapes, core/tier_key.h), std::string,
// int, double (always finite) or bool.
// bounds: the valid range (Bounds in adaptive_config.h); Bounds{} for none.
// A default or bounds containing a comma goes in parentheses.
// No include guard: the includer defines X.
#define SPECSWAP_ADAPTIVE_CONFIG_FIELDS(X)                                                         \
  X(PolicyKind, policy, PolicyKind::kSglang, Bounds{},                                              \
    "the policy: 'sglang' (EMA of accepted drafts against the thresholds tier - 0.5) or "          \
    "'goodput' (argmax expected tokens / cost per round) or 'python' (a class of python_policy's)")  \
  X(std::string, python_policy, std::string{}, Bounds{},                                          \
    "policy 'python' only: the policy's class, 'module:Class' (docs/policy.md)")                    \
  X(std::vector<int>, candidate_steps, (std::vector<int>{1, 3, 7}), Bounds::closed(0, kMaxAdaptiveSteps), \
    "the step counts (tiers) the policy chooses among")                                             \
  X(TreeShapes, candidate_trees, (TreeShapes{}), Bounds{},                                        \
    "goodput only: draft trees [speculative_num_steps, speculative_eagle_topk, "                    \
    "speculative_num_draft_tokens] the policy chooses among beside the chains of candidate_steps")   \
  X(double, ema_alpha, 0.2, Bounds::open_closed(0, 1),                                              \
    "EMA weight of one batch (goodput: of 4 requests) in the acceptance estimates and costs")       \
  X(int, update_interval, 5, Bounds::at_least(1), "batches between two decisions")                  \
  X(int, warmup_batches, 10, Bounds::at_least(0), "batches before the first decision")              \
  X(double, down_hysteresis, -0.25, Bounds{}, "sglang only: band below tier - 0.5 before moving down") \
  X(double, up_hysteresis, 0.0, Bounds{}, "sglang only: band above tier - 0.5 before moving up")    \
  X(bool, snap_initial_steps, false, Bounds{},                                                      \
    "false: the initial step count joins the candidates (no unused state is built for it later); " \
    "true: it snaps to the nearest candidate, ties to the larger (SGLang's original behaviour)")    \
  X(double, min_gain, 0.03, Bounds::at_least(0),                                                    \
    "goodput only: switch when the best tier's predicted goodput beats the current tier's by more " \
    "than this fraction")                                                                           \
  X(double, noise_margin, 0.0, Bounds::at_least(0),                                                 \
    "goodput only: standard errors of the first draft's acceptance estimate that an up move's "     \
    "predicted gain must also clear (0: min_gain alone)")                                           \
  X(double, collapse_evidence, 0.0, Bounds::at_least(0),                                            \
    "goodput only: log-likelihood ratio (nats) at which the first draft's recent outcomes show its " \
    "rate fallen to half the decisions' estimate; a lower tier that then pays is taken at once "    \
    "(0: off)")                                                                                     \
  X(double, cost_prior_slope, 0.1, Bounds::at_least(0),                                             \
    "goodput only: cost of one draft step relative to a round without speculation, for tiers "     \
    "never timed (and every tier when update() gets no timing)")                                    \
  X(int, probe_rounds, 2, Bounds::at_least(0),                                                      \
    "goodput only: batches spent on each candidate at start-up so every tier's cost is measured "   \
    "(0: no probing)")                                                                              \
  X(int, probe_interval, 50, Bounds::at_least(1),                                                   \
    "goodput only: at tier 0 the best speculative tier is tried for probe_rounds batches (at least " \
    "one) after 2 * update_interval batches, then after twice as many each time the policy comes "  \
    "back to 0, up to this many batches")                                                           \
  X(int, refresh_interval, 0, Bounds::at_least(0),                                                 \
    "goodput only: after this many batches at one drafting tier, a decision that keeps it runs the "\
    "neighbour tier timed longest ago for probe_rounds batches, so that its cost is measured beside " \
    "the current tier's again, and decides from the current tier (0: never)")                      \
  X(double, blind_zero_margin, 0.0, Bounds::at_least(0),                                           \
    "goodput only: from a drafting tier, tier 0's predicted goodput must win by this fraction more " \
    "while the drafter has sent no shadow observations (it is blind at tier 0, e.g. EAGLE: it "     \
    "learns nothing there until its next probe)")                                                   \
  X(AcceptanceModel, acceptance_model, AcceptanceModel::kGeometric, Bounds{},                       \
    "goodput only: 'geometric' = E(k) from one alpha; 'positional' = from the acceptance rate of "  \
    "each draft position up to the current tier, the deepest standing in for those beyond (bursty " \
    "drafters such as NGRAM: once a match runs, it runs on)")

"""Speculative decoding: proposers suggest tokens, the target verifies them in one pass.

`config.SpeculativeConfig` selects the method; `ngram.NgramProposer` and
`draft_proposer.DraftModelProposer` propose; `rejection_sampler` accepts or rejects by
the rule of Chen et al. (2023); `speculator.Speculator` ties them into the model runner's
step; `stats.SpecDecodeStats` counts what was proposed and accepted.
"""

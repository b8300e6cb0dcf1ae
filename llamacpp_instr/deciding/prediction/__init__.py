"""How fast a setting not run would be: `predict` builds the setting's graphs and prices them op
by op (`op_costs`, fitted by `op_fit`; splits and copies: `split_costs`; the network: `net_costs`;
a MoE's measured expert traffic: `expert_traffic`); `spec_predict` prices speculative decoding."""

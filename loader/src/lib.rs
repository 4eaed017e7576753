//! Stateless sampler and step-ordered DataLoader. Filled by the loader issue.

//! `cites!`: `matches!` over an error (or a result), and the rule the error
//! cites is one of those named (`zt::Rule::name`). Shared by the per-format
//! test files, whose hostile cases assert the rule as well as the variant.

/// An error, or a result holding one, whose rule a test reads.
pub trait Cited {
    /// The rule's name, if an error citing one is there.
    fn cited(&self) -> Option<&'static str>;
}

impl Cited for zt::Error {
    fn cited(&self) -> Option<&'static str> {
        self.rule().map(zt::Rule::name)
    }
}

impl<T> Cited for Result<T, zt::Error> {
    fn cited(&self) -> Option<&'static str> {
        self.as_ref().err().and_then(Cited::cited)
    }
}

impl<C: Cited> Cited for &C {
    fn cited(&self) -> Option<&'static str> {
        (**self).cited()
    }
}

/// True if `got` matches the pattern and cites one of `rules`.
macro_rules! cites {
    ($got:expr, $pat:pat, $rules:expr) => {{
        let got = &$got;
        let cited = crate::cites::Cited::cited(&got);
        let rules: &[&str] = $rules;
        let hit = matches!(got, $pat);
        assert!(
            !hit || cited.is_some_and(|c| rules.contains(&c)),
            "{}:{}: cites {cited:?}, not one of {rules:?}",
            file!(),
            line!()
        );
        hit
    }};
}

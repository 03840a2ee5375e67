//! The known name nearest to one that matched none. Every unknown-name error of pebble's
//! (models, solvers, policies, profiles) ends with it, so a typo gets its fix.

/// `"; did you mean `x`?"` for the known name nearest `name`, or `""` where none is near:
/// the least edit distance (Damerau–Levenshtein, case ignored), at most a third of
/// `name`'s length (and at least 1); the first such name in `known` on a tie.
///
/// ```
/// use pebble_machine::names::did_you_mean;
/// let known = ["rotor", "rockmate", "gpt2-small"];
/// assert_eq!(did_you_mean("rotr", known), "; did you mean `rotor`?");
/// assert_eq!(did_you_mean("GPT2small", known), "; did you mean `gpt2-small`?");
/// assert_eq!(did_you_mean("nope", known), "");
/// ```
pub fn did_you_mean<'a>(name: &str, known: impl IntoIterator<Item = &'a str>) -> String {
    let asked = name.to_lowercase();
    let limit = (asked.chars().count() / 3).max(1);
    let mut best: Option<(usize, &str)> = None;
    for candidate in known {
        let d = strsim::damerau_levenshtein(&asked, &candidate.to_lowercase());
        if d <= limit && best.is_none_or(|(b, _)| d < b) {
            best = Some((d, candidate));
        }
    }
    best.map_or_else(String::new, |(_, n)| format!("; did you mean `{n}`?"))
}

#[cfg(test)]
mod tests {
    use super::did_you_mean;

    #[test]
    fn the_nearest_name_within_a_third_of_the_length() {
        let zoo = ["resnet50", "resnet101", "inception_v3", "llama2-7b", "gpt", "gpt2-small"];
        assert_eq!(did_you_mean("resnet-50", zoo), "; did you mean `resnet50`?");
        assert_eq!(did_you_mean("inceptionv3", zoo), "; did you mean `inception_v3`?");
        assert_eq!(did_you_mean("ResNet101", zoo), "; did you mean `resnet101`?");
        // Two edits in 7 characters are within a third (7 / 3, rounded down).
        assert_eq!(did_you_mean("llama7b", zoo), "; did you mean `llama2-7b`?");
        // A transposition is one edit.
        assert_eq!(did_you_mean("gtp", zoo), "; did you mean `gpt`?");
        // Nothing near: no suggestion rather than a wrong one.
        assert_eq!(did_you_mean("vgg", zoo), "");
        assert_eq!(did_you_mean("", zoo), "");
        assert_eq!(did_you_mean("x", []), "");
    }

    #[test]
    fn a_tie_goes_to_the_first_known_name() {
        assert_eq!(did_you_mean("lrx", ["lru", "lrz"]), "; did you mean `lru`?");
        assert_eq!(did_you_mean("lrx", ["lrz", "lru"]), "; did you mean `lrz`?");
    }
}

//! The `problem` argument: `{"graph": <TrainingGraph>}`, `{"chain": <Chain>}`, or both
//! (a graph and its chain view), each read by its own reader so that errors name the
//! field (`problem.graph: field `compute[3].time`: ...`).

use std::borrow::Cow;

use pebble_graph::{Chain, TrainingGraph};
use pebble_schedule::View;
use pebble_solve::Problem;
use serde_json::Value;

use crate::chain_view::chain_view;
use crate::error::{ApiError, Result};

/// A problem as given.
#[derive(Debug, Clone)]
pub struct Given {
    /// The training graph, if given.
    pub graph: Option<TrainingGraph>,
    /// The chain, if given.
    pub chain: Option<Chain>,
}

/// One view of a problem, owned or borrowed, ready for a solver or the simulator.
pub enum Subject<'a> {
    /// A chain: the one given, or a graph's chain view (boxed: a chain is large).
    Chain(Box<Cow<'a, Chain>>),
    /// The graph given.
    Graph(&'a TrainingGraph),
}

impl Subject<'_> {
    /// The solver's problem.
    pub fn problem(&self) -> Problem<'_> {
        match self {
            Subject::Chain(c) => Problem::Chain(c),
            Subject::Graph(g) => Problem::Graph(g),
        }
    }
}

/// Reads `problem`.
pub fn parse(text: &str) -> Result<Given> {
    let value: Value = serde_json::from_str(text).map_err(|e| ApiError::bad(format!("problem: not JSON: {e}")))?;
    let Value::Object(obj) = value else {
        return Err(ApiError::bad("problem: expected an object {\"graph\": ...} or {\"chain\": ...}"));
    };
    if let Some(k) = obj.keys().find(|k| !matches!(k.as_str(), "graph" | "chain")) {
        return Err(ApiError::bad(format!("problem: unknown field `{k}` (expected `graph`, `chain` or both)")));
    }
    let graph = match obj.get("graph") {
        None | Some(Value::Null) => None,
        Some(g) => {
            Some(TrainingGraph::from_json(&g.to_string()).map_err(|e| ApiError::bad(format!("problem.graph: {e}")))?)
        }
    };
    let chain = match obj.get("chain") {
        None | Some(Value::Null) => None,
        Some(c) => Some(Chain::from_json(&c.to_string()).map_err(|e| ApiError::bad(format!("problem.chain: {e}")))?),
    };
    if graph.is_none() && chain.is_none() {
        return Err(ApiError::bad("problem: give `graph` or `chain`"));
    }
    Ok(Given { graph, chain })
}

impl Given {
    /// The views given (not derived): the graph's, then the chain's.
    pub fn views(&self) -> Vec<View> {
        let mut v = Vec::new();
        if self.graph.is_some() {
            v.push(View::Graph);
        }
        if self.chain.is_some() {
            v.push(View::Chain);
        }
        v
    }

    /// The problem in `view`: the chain given, or else the graph's chain view.
    pub fn view(&self, view: View) -> Result<Subject<'_>> {
        match view {
            View::Graph => self
                .graph
                .as_ref()
                .map(Subject::Graph)
                .ok_or_else(|| ApiError::bad("problem: a graph schedule needs `graph`, which the problem lacks")),
            View::Chain => match (&self.chain, &self.graph) {
                (Some(c), _) => Ok(Subject::Chain(Box::new(Cow::Borrowed(c)))),
                (None, Some(g)) => chain_view(g)
                    .map(|(c, _)| Subject::Chain(Box::new(Cow::Owned(c))))
                    .map_err(|e| ApiError::bad(format!("problem.graph: no chain view: {e}"))),
                (None, None) => unreachable!("parse requires one"),
            },
            View::Pipeline => Err(ApiError::bad("a pipeline schedule is not planned or run here")),
        }
    }

    /// The view `views` (a solver's) plans here: the graph where the solver plans graphs
    /// and one is given; else the chain, given or the graph's chain view (as the CLI
    /// picks for a graph file).
    pub fn view_for(&self, solver: &str, views: &[View]) -> Result<View> {
        if views.contains(&View::Graph) && self.graph.is_some() {
            Ok(View::Graph)
        } else if views.contains(&View::Chain) {
            Ok(View::Chain)
        } else {
            Err(ApiError::bad(format!(
                "solver `{solver}` plans only the {:?} view, which the problem does not have (give `graph`)",
                views
            )))
        }
    }
}

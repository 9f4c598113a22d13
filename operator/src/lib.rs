//! HeteroTrain operator.

"""The leader's reconcilers: level-based passes that make node taints and pool membership match the
policy (taints), and remove or report pods that may not be on pool nodes (intruders)."""

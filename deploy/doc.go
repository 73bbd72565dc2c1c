// Package deploy holds no code: the directory carries the operational files of subscriberd
// (Prometheus rules and config, Grafana dashboards and provisioning). Its tests check those
// files against the metrics the service really exports, so dashboards and alerts cannot drift
// from the code.
package deploy

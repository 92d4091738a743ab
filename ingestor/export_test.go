package ingestor

// SetStalled and ClearStalled drive the stalled gauge as a worker does
// (worker.go), for the metrics test.
func (m *Metrics) SetStalled(replica string, v float64) { m.stalled.WithLabelValues(replica).Set(v) }
func (m *Metrics) ClearStalled(replica string)          { m.stalled.DeleteLabelValues(replica) }

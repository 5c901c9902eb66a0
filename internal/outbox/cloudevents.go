package outbox

// Kafka header names of the CloudEvents 1.0 Kafka protocol binding, binary
// content mode (R7). The record value is the event payload itself; the
// event's attributes travel in these headers. Consumers read ce_id to
// deduplicate and ce_subject plus ce_aggregateversion to order.
const (
	HeaderSpecVersion = "ce_specversion" // always "1.0"
	HeaderID          = "ce_id"          // outbox event_id, stable across re-sends
	HeaderType        = "ce_type"        // event_type
	HeaderSource      = "ce_source"      // Config.Source
	HeaderSubject     = "ce_subject"     // aggregate_id, also the record key
	HeaderTime        = "ce_time"        // created_at (the business commit), RFC 3339
	HeaderContentType = "content-type"   // always "application/json"

	// Extension attributes.
	HeaderAggregateType    = "ce_aggregatetype"
	HeaderAggregateVersion = "ce_aggregateversion" // decimal
	HeaderSchemaVersion    = "ce_schemaversion"    // decimal

	// HeaderTraceparent carries the W3C trace context of the request that
	// wrote the event, when it had one.
	HeaderTraceparent = "traceparent"
)

-- Clinic domain: tables (static constraints) then triggers (the compiled policy).

CREATE TABLE clock ( -- the simulated current date read by the triggers
  clock_id INTEGER PRIMARY KEY CHECK (clock_id = 1),
  today TEXT NOT NULL -- YYYY-MM-DD
);

CREATE TABLE patient ( -- registered patients
  patient_id TEXT PRIMARY KEY NOT NULL, -- e.g. P-1001
  full_name TEXT NOT NULL,
  date_of_birth TEXT NOT NULL, -- YYYY-MM-DD
  phone TEXT,
  insurance_plan TEXT NOT NULL CHECK (insurance_plan IN ('none', 'basic', 'premium')),
  no_show_count INTEGER NOT NULL DEFAULT 0 CHECK (no_show_count >= 0),
  status TEXT NOT NULL DEFAULT 'active' CHECK (status IN ('active', 'suspended'))
);

CREATE TABLE doctor ( -- clinic doctors
  doctor_id TEXT PRIMARY KEY NOT NULL, -- e.g. D-01
  full_name TEXT NOT NULL,
  specialty TEXT NOT NULL CHECK (specialty IN ('general', 'cardiology', 'dermatology', 'orthopedics')),
  daily_capacity INTEGER NOT NULL CHECK (daily_capacity > 0) -- max scheduled appointments per day
);

CREATE TABLE referral ( -- referrals to a specialty, issued by a general practitioner
  referral_id INTEGER PRIMARY KEY,
  patient_id TEXT NOT NULL REFERENCES patient(patient_id),
  specialty TEXT NOT NULL CHECK (specialty IN ('cardiology', 'dermatology', 'orthopedics')),
  issued_by TEXT NOT NULL REFERENCES doctor(doctor_id),
  expires_on TEXT NOT NULL, -- last valid appointment date YYYY-MM-DD
  status TEXT NOT NULL DEFAULT 'open' CHECK (status IN ('open', 'used'))
);

CREATE TABLE appointment ( -- appointments of patients with doctors
  appointment_id INTEGER PRIMARY KEY,
  patient_id TEXT NOT NULL REFERENCES patient(patient_id),
  doctor_id TEXT NOT NULL REFERENCES doctor(doctor_id),
  date TEXT NOT NULL, -- YYYY-MM-DD
  slot TEXT NOT NULL CHECK (slot IN ('09:00', '10:00', '11:00', '14:00', '15:00', '16:00')),
  kind TEXT NOT NULL CHECK (kind IN ('consultation', 'follow_up')),
  status TEXT NOT NULL DEFAULT 'scheduled' CHECK (status IN ('scheduled', 'completed', 'cancelled', 'no_show')),
  copay REAL, -- USD, set from the insurance plan when booked
  referral_id INTEGER REFERENCES referral(referral_id) -- referral used by a specialist appointment
);

CREATE TABLE drug ( -- formulary
  drug_id TEXT PRIMARY KEY NOT NULL, -- e.g. DRG-LISI
  name TEXT NOT NULL,
  controlled BOOLEAN NOT NULL, -- controlled substance
  max_quantity INTEGER NOT NULL CHECK (max_quantity > 0) -- max units per prescription
);

CREATE TABLE prescription ( -- prescriptions and their remaining refills
  rx_id INTEGER PRIMARY KEY,
  patient_id TEXT NOT NULL REFERENCES patient(patient_id),
  doctor_id TEXT NOT NULL REFERENCES doctor(doctor_id),
  drug_id TEXT NOT NULL REFERENCES drug(drug_id),
  quantity INTEGER NOT NULL CHECK (quantity > 0), -- units per fill
  refills_left INTEGER NOT NULL DEFAULT 0 CHECK (refills_left >= 0),
  status TEXT NOT NULL DEFAULT 'active' CHECK (status IN ('active', 'completed', 'revoked')),
  issued_on TEXT -- YYYY-MM-DD
);

CREATE TABLE audit_log ( -- append-only journal written by the triggers
  log_id INTEGER PRIMARY KEY,
  entity TEXT NOT NULL,
  entity_id TEXT NOT NULL,
  event TEXT NOT NULL,
  detail TEXT,
  logged_on TEXT
);

-- ============================================================================ booking

CREATE TRIGGER appointment_insert_rules
BEFORE INSERT ON appointment
BEGIN
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: patient_active: suspended patients cannot book appointments')
  WHERE (SELECT status FROM patient WHERE patient_id = NEW.patient_id) IS NOT 'active';
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: new_appointment_scheduled: new appointments are created with status scheduled')
  WHERE NEW.status IS NOT 'scheduled';
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: future_date_only: appointments are booked for a date after today and at most 30 days ahead')
  WHERE julianday(NEW.date) IS NULL
     OR julianday(NEW.date) <= julianday((SELECT today FROM clock))
     OR julianday(NEW.date) > julianday((SELECT today FROM clock)) + 30;
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: weekday_only: the clinic is closed on Saturdays and Sundays')
  WHERE strftime('%w', NEW.date) IN ('0', '6');
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: slot_taken: the doctor already has an appointment in this slot')
  WHERE EXISTS (SELECT 1 FROM appointment WHERE doctor_id = NEW.doctor_id AND date = NEW.date
                AND slot = NEW.slot AND status = 'scheduled');
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: doctor_capacity: the doctor has no capacity left on this day')
  WHERE (SELECT COUNT(*) FROM appointment WHERE doctor_id = NEW.doctor_id AND date = NEW.date
         AND status = 'scheduled') >= (SELECT daily_capacity FROM doctor WHERE doctor_id = NEW.doctor_id);
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: patient_double_booking: the patient already has an appointment in this slot')
  WHERE EXISTS (SELECT 1 FROM appointment WHERE patient_id = NEW.patient_id AND date = NEW.date
                AND slot = NEW.slot AND status = 'scheduled');
END;

CREATE TRIGGER appointment_specialist_rules
BEFORE INSERT ON appointment
WHEN (SELECT specialty FROM doctor WHERE doctor_id = NEW.doctor_id) <> 'general'
BEGIN
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: referral_required: a specialist appointment needs an open referral for the specialty, valid on the appointment date, unless the plan is premium')
  WHERE (SELECT insurance_plan FROM patient WHERE patient_id = NEW.patient_id) <> 'premium'
    AND NOT EXISTS (SELECT 1 FROM referral r
                    WHERE r.patient_id = NEW.patient_id AND r.status = 'open'
                      AND r.specialty = (SELECT specialty FROM doctor WHERE doctor_id = NEW.doctor_id)
                      AND r.expires_on >= NEW.date);
END;

CREATE TRIGGER appointment_follow_up_rules
BEFORE INSERT ON appointment
WHEN NEW.kind = 'follow_up'
BEGIN
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: follow_up_history: a follow-up needs an earlier completed appointment with the same doctor')
  WHERE NOT EXISTS (SELECT 1 FROM appointment WHERE patient_id = NEW.patient_id
                    AND doctor_id = NEW.doctor_id AND status = 'completed');
END;

CREATE TRIGGER appointment_after_insert
AFTER INSERT ON appointment
BEGIN
  -- The copay is set from the insurance plan and the doctor's specialty, an open referral for the specialty is marked used and linked, and the booking is logged
  UPDATE appointment
  SET copay = (SELECT CASE p.insurance_plan
                        WHEN 'premium' THEN 0
                        WHEN 'basic' THEN CASE d.specialty WHEN 'general' THEN 20 ELSE 40 END
                        ELSE CASE d.specialty WHEN 'general' THEN 80 ELSE 150 END END
               FROM patient p, doctor d WHERE p.patient_id = NEW.patient_id AND d.doctor_id = NEW.doctor_id),
      referral_id = (SELECT r.referral_id FROM referral r, doctor d
                     WHERE d.doctor_id = NEW.doctor_id AND d.specialty <> 'general'
                       AND r.patient_id = NEW.patient_id AND r.specialty = d.specialty
                       AND r.status = 'open' AND r.expires_on >= NEW.date
                     ORDER BY r.expires_on, r.referral_id LIMIT 1)
  WHERE appointment_id = NEW.appointment_id;
  UPDATE referral SET status = 'used'
  WHERE referral_id = (SELECT referral_id FROM appointment WHERE appointment_id = NEW.appointment_id);
  INSERT INTO audit_log (entity, entity_id, event, detail, logged_on)
  VALUES ('appointment', NEW.appointment_id, 'booked',
          NEW.patient_id || ' with ' || NEW.doctor_id || ' on ' || NEW.date || ' ' || NEW.slot,
          (SELECT today FROM clock));
END;

-- ============================================================================ changes

CREATE TRIGGER appointment_fixed_fields
BEFORE UPDATE OF patient_id, doctor_id, date, slot, kind ON appointment
BEGIN
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: appointment_fixed_fields: the patient, doctor, date, slot and kind cannot change; cancel and book a new appointment')
  WHERE NEW.patient_id IS NOT OLD.patient_id OR NEW.doctor_id IS NOT OLD.doctor_id
     OR NEW.date IS NOT OLD.date OR NEW.slot IS NOT OLD.slot OR NEW.kind IS NOT OLD.kind;
END;

CREATE TRIGGER appointment_status_rules
BEFORE UPDATE OF status ON appointment
WHEN NEW.status IS NOT OLD.status
BEGIN
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: status_final: only scheduled appointments can change status')
  WHERE OLD.status <> 'scheduled';
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: cancellation_notice: an appointment can only be cancelled before its day')
  WHERE NEW.status = 'cancelled' AND OLD.date <= (SELECT today FROM clock);
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: outcome_after_visit: an appointment is marked completed or no_show only on or after its date')
  WHERE NEW.status IN ('completed', 'no_show') AND OLD.date > (SELECT today FROM clock);
END;

CREATE TRIGGER appointment_after_status
AFTER UPDATE OF status ON appointment
WHEN NEW.status IS NOT OLD.status
BEGIN
  -- A no-show adds one to the patient's no_show_count (the third suspends the patient); a cancellation re-opens the referral it used; the change is logged
  UPDATE patient SET no_show_count = no_show_count + 1,
                     status = CASE WHEN no_show_count + 1 >= 3 THEN 'suspended' ELSE status END
  WHERE patient_id = NEW.patient_id AND NEW.status = 'no_show';
  UPDATE referral SET status = 'open'
  WHERE NEW.status = 'cancelled' AND referral_id = NEW.referral_id;
  INSERT INTO audit_log (entity, entity_id, event, detail, logged_on)
  VALUES ('appointment', NEW.appointment_id, NEW.status, NULL, (SELECT today FROM clock));
END;

-- ============================================================================ prescriptions

CREATE TRIGGER prescription_insert_rules
BEFORE INSERT ON prescription
BEGIN
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: established_patient: a doctor can only prescribe to a patient they have seen in a completed appointment')
  WHERE NOT EXISTS (SELECT 1 FROM appointment WHERE patient_id = NEW.patient_id
                    AND doctor_id = NEW.doctor_id AND status = 'completed');
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: quantity_limit: the quantity cannot exceed the drug maximum quantity')
  WHERE NEW.quantity > (SELECT max_quantity FROM drug WHERE drug_id = NEW.drug_id);
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: controlled_no_refills: controlled drugs are prescribed without refills')
  WHERE (SELECT controlled FROM drug WHERE drug_id = NEW.drug_id) = 1 AND NEW.refills_left > 0;
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: duplicate_prescription: the patient already has an active prescription of this drug')
  WHERE EXISTS (SELECT 1 FROM prescription WHERE patient_id = NEW.patient_id
                AND drug_id = NEW.drug_id AND status = 'active');
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: new_prescription_active: new prescriptions are created with status active')
  WHERE NEW.status IS NOT 'active';
END;

CREATE TRIGGER prescription_after_insert
AFTER INSERT ON prescription
BEGIN
  -- issued_on is set to today and the prescription is logged
  UPDATE prescription SET issued_on = (SELECT today FROM clock) WHERE rx_id = NEW.rx_id;
  INSERT INTO audit_log (entity, entity_id, event, detail, logged_on)
  VALUES ('prescription', NEW.rx_id, 'issued', NEW.drug_id || ' x' || NEW.quantity, (SELECT today FROM clock));
END;

CREATE TRIGGER prescription_refill_rules
BEFORE UPDATE OF refills_left ON prescription
WHEN NEW.refills_left IS NOT OLD.refills_left
BEGIN
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: prescription_active: only active prescriptions can be refilled')
  WHERE OLD.status <> 'active';
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: no_refills_left: the prescription has no refills left; the patient needs a new prescription')
  WHERE OLD.refills_left = 0;
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: refill_one_at_a_time: a refill lowers refills_left by exactly one')
  WHERE NEW.refills_left <> OLD.refills_left - 1;
END;

CREATE TRIGGER prescription_status_rules
BEFORE UPDATE OF status ON prescription
WHEN NEW.status IS NOT OLD.status
BEGIN
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: prescription_final: completed or revoked prescriptions cannot change status')
  WHERE OLD.status <> 'active';
END;

CREATE TRIGGER prescription_after_refill
AFTER UPDATE OF refills_left ON prescription
WHEN NEW.refills_left = OLD.refills_left - 1
BEGIN
  -- The refill is logged; dispensing the last refill completes the prescription
  UPDATE prescription SET status = 'completed' WHERE rx_id = NEW.rx_id AND NEW.refills_left = 0;
  INSERT INTO audit_log (entity, entity_id, event, detail, logged_on)
  VALUES ('prescription', NEW.rx_id, 'refill', NEW.refills_left || ' left', (SELECT today FROM clock));
END;

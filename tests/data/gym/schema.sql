-- IronLeaf Fitness front desk

CREATE TABLE gym_today ( -- simulated date
  k INTEGER PRIMARY KEY CHECK (k = 1),
  d TEXT NOT NULL
);

CREATE TABLE member ( -- gym members
  member_no TEXT PRIMARY KEY NOT NULL, -- M-xxxxx
  name TEXT NOT NULL,
  plan TEXT NOT NULL CHECK (plan IN ('basic', 'offpeak', 'premium')),
  joined TEXT NOT NULL,
  exp_date TEXT NOT NULL, -- last day of membership
  status TEXT NOT NULL DEFAULT 'active' CHECK (status IN ('active', 'lapsed', 'banned')),
  bal_due REAL NOT NULL DEFAULT 0 -- unpaid penalty fees
);

CREATE TABLE class_session ( -- timetable
  session_code TEXT PRIMARY KEY NOT NULL,
  class_name TEXT NOT NULL,
  cat TEXT NOT NULL CHECK (cat IN ('standard', 'premium')),
  coach TEXT NOT NULL,
  day TEXT NOT NULL,
  start_time TEXT NOT NULL, -- HH:MM
  mins INTEGER NOT NULL CHECK (mins > 0),
  cap INTEGER NOT NULL CHECK (cap > 0)
);

CREATE TABLE booking (
  bk_id INTEGER PRIMARY KEY,
  member_no TEXT NOT NULL REFERENCES member(member_no),
  session_code TEXT NOT NULL REFERENCES class_session(session_code),
  src TEXT NOT NULL DEFAULT 'desk' CHECK (src IN ('desk', 'waitlist')),
  status TEXT NOT NULL DEFAULT 'booked'
    CHECK (status IN ('booked', 'cancelled', 'late_cancel', 'attended', 'no_show'))
);

CREATE TABLE waitlist (
  session_code TEXT NOT NULL REFERENCES class_session(session_code),
  member_no TEXT NOT NULL REFERENCES member(member_no),
  pos INTEGER, -- queue position
  status TEXT NOT NULL DEFAULT 'waiting' CHECK (status IN ('waiting', 'promoted', 'withdrawn')),
  PRIMARY KEY (session_code, member_no)
);

CREATE TABLE freeze ( -- membership freezes
  freeze_id TEXT PRIMARY KEY NOT NULL, -- FRZ-yyyy-nnn
  member_no TEXT NOT NULL REFERENCES member(member_no),
  start_d TEXT NOT NULL,
  end_d TEXT NOT NULL,
  reason TEXT,
  status TEXT NOT NULL DEFAULT 'approved' CHECK (status IN ('approved', 'cancelled'))
);

CREATE TABLE guest_visit (
  member_no TEXT NOT NULL REFERENCES member(member_no),
  visit_day TEXT NOT NULL,
  guest_name TEXT NOT NULL,
  PRIMARY KEY (member_no, visit_day, guest_name)
);

-- ---------------------------------------------------------------- bookings

CREATE TRIGGER booking_member_checks
BEFORE INSERT ON booking
WHEN NEW.src = 'desk'
BEGIN
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: booking_status_flow: a booking is created as booked')
  WHERE NEW.status IS NOT 'booked';
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: member_active: the member is not active or the membership ends before the class day')
  WHERE NOT EXISTS (SELECT 1 FROM member m, class_session s
                    WHERE m.member_no = NEW.member_no AND s.session_code = NEW.session_code
                      AND m.status = 'active' AND m.exp_date >= s.day);
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: no_booking_while_frozen: the member has an approved freeze on the class day')
  WHERE EXISTS (SELECT 1 FROM freeze f, class_session s
                WHERE f.member_no = NEW.member_no AND f.status = 'approved'
                  AND s.session_code = NEW.session_code AND s.day BETWEEN f.start_d AND f.end_d);
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: plan_access: basic members cannot book premium classes; offpeak members cannot book classes starting 16:00-19:59 on weekdays')
  WHERE (SELECT CASE m.plan
                  WHEN 'basic' THEN s.cat = 'premium'
                  WHEN 'offpeak' THEN strftime('%w', s.day) BETWEEN '1' AND '5'
                                      AND s.start_time >= '16:00' AND s.start_time < '20:00'
                  ELSE 0
                END
         FROM member m, class_session s
         WHERE m.member_no = NEW.member_no AND s.session_code = NEW.session_code);
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: booking_window: classes are booked from today up to 7 days ahead')
  WHERE (SELECT julianday(s.day) - julianday((SELECT d FROM gym_today))
         FROM class_session s WHERE s.session_code = NEW.session_code) NOT BETWEEN 0 AND 7;
END;

CREATE TRIGGER booking_capacity_checks
BEFORE INSERT ON booking
WHEN NEW.src = 'desk'
BEGIN
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: monthly_class_cap: the member has reached the monthly booking limit of the plan (basic 8, offpeak 12)')
  WHERE (SELECT COUNT(*) FROM booking b JOIN class_session s ON s.session_code = b.session_code
         WHERE b.member_no = NEW.member_no AND b.status <> 'cancelled'
           AND strftime('%Y-%m', s.day) = (SELECT strftime('%Y-%m', day) FROM class_session
                                           WHERE session_code = NEW.session_code))
        >= (SELECT CASE plan WHEN 'basic' THEN 8 WHEN 'offpeak' THEN 12 ELSE 1000000 END
            FROM member WHERE member_no = NEW.member_no);
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: class_full: the class is full; offer the waitlist')
  WHERE (SELECT COUNT(*) FROM booking WHERE session_code = NEW.session_code AND status = 'booked')
        >= (SELECT cap FROM class_session WHERE session_code = NEW.session_code);
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: time_clash: the member already has a booked class overlapping this one')
  WHERE EXISTS (SELECT 1 FROM booking b
                JOIN class_session o ON o.session_code = b.session_code
                JOIN class_session n ON n.session_code = NEW.session_code
                WHERE b.member_no = NEW.member_no AND b.status = 'booked' AND o.day = n.day
                  AND o.start_time < time(n.start_time, '+' || n.mins || ' minutes')
                  AND n.start_time < time(o.start_time, '+' || o.mins || ' minutes'));
END;

CREATE TRIGGER booking_fixed
BEFORE UPDATE OF member_no, session_code, src ON booking
BEGIN
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: booking_status_flow: the member and class of a booking never change')
  WHERE NEW.member_no IS NOT OLD.member_no OR NEW.session_code IS NOT OLD.session_code
     OR NEW.src IS NOT OLD.src;
END;

CREATE TRIGGER booking_status_checks
BEFORE UPDATE OF status ON booking
WHEN NEW.status IS NOT OLD.status
BEGIN
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: booking_status_flow: only booked places change status; attended and no_show are recorded on or after the class day')
  WHERE OLD.status <> 'booked'
     OR (NEW.status IN ('attended', 'no_show')
         AND (SELECT day FROM class_session WHERE session_code = NEW.session_code) > (SELECT d FROM gym_today));
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: cancel_notice: a cancellation is possible only before the class day; on the day record late_cancel')
  WHERE CASE NEW.status
          WHEN 'cancelled' THEN julianday((SELECT day FROM class_session WHERE session_code = NEW.session_code))
                                - julianday((SELECT d FROM gym_today)) < 1
          WHEN 'late_cancel' THEN (SELECT day FROM class_session WHERE session_code = NEW.session_code)
                                  IS NOT (SELECT d FROM gym_today)
          ELSE 0
        END;
END;

CREATE TRIGGER booking_after_status
AFTER UPDATE OF status ON booking
WHEN NEW.status IS NOT OLD.status
BEGIN
  -- Fees: late_cancel adds 5.00 and no_show 8.00 to the member's bal_due; a freed place (cancelled or late_cancel) goes to the first waiting member of the class, whose waitlist entry becomes promoted
  UPDATE member
  SET bal_due = round(bal_due + CASE NEW.status WHEN 'late_cancel' THEN 5.0 WHEN 'no_show' THEN 8.0 ELSE 0 END, 2)
  WHERE member_no = NEW.member_no AND NEW.status IN ('late_cancel', 'no_show');
  INSERT INTO booking (member_no, session_code, src, status)
  SELECT w.member_no, w.session_code, 'waitlist', 'booked' FROM waitlist w
  WHERE NEW.status IN ('cancelled', 'late_cancel') AND w.session_code = NEW.session_code AND w.status = 'waiting'
  ORDER BY w.pos LIMIT 1;
  UPDATE waitlist SET status = 'promoted'
  WHERE NEW.status IN ('cancelled', 'late_cancel') AND session_code = NEW.session_code
    AND member_no = (SELECT member_no FROM waitlist WHERE session_code = NEW.session_code AND status = 'waiting'
                     ORDER BY pos LIMIT 1);
END;

-- ---------------------------------------------------------------- waitlist

CREATE TRIGGER waitlist_join_checks
BEFORE INSERT ON waitlist
BEGIN
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: waitlist_entry: new waitlist entries start as waiting')
  WHERE NEW.status IS NOT 'waiting';
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: waitlist_when_full: the class still has free places; book it instead')
  WHERE (SELECT COUNT(*) FROM booking WHERE session_code = NEW.session_code AND status = 'booked')
        < (SELECT cap FROM class_session WHERE session_code = NEW.session_code);
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: waitlist_max: a member can wait on at most 2 classes at a time')
  WHERE (SELECT COUNT(*) FROM waitlist WHERE member_no = NEW.member_no AND status = 'waiting') >= 2;
END;

CREATE TRIGGER waitlist_after_join
AFTER INSERT ON waitlist
BEGIN
  -- the new entry goes to the end of the queue
  UPDATE waitlist
  SET pos = (SELECT COALESCE(MAX(pos), 0) + 1 FROM waitlist
             WHERE session_code = NEW.session_code AND member_no <> NEW.member_no)
  WHERE session_code = NEW.session_code AND member_no = NEW.member_no;
END;

CREATE TRIGGER waitlist_status_checks
BEFORE UPDATE OF status ON waitlist
WHEN NEW.status IS NOT OLD.status
BEGIN
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: waitlist_entry: only a waiting entry can change, to withdrawn or (by the system) promoted')
  WHERE OLD.status <> 'waiting' OR NEW.status NOT IN ('withdrawn', 'promoted');
END;

-- ---------------------------------------------------------------- freezes

CREATE TRIGGER freeze_new_checks
BEFORE INSERT ON freeze
BEGIN
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: freeze_terms: a new freeze is approved, starts at least 2 days after today and lasts 7 to 30 days')
  WHERE NEW.status IS NOT 'approved'
     OR julianday(NEW.start_d) - julianday((SELECT d FROM gym_today)) < 2
     OR julianday(NEW.end_d) - julianday(NEW.start_d) + 1 NOT BETWEEN 7 AND 30;
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: annual_freeze_allowance: at most 45 freeze days per calendar year')
  WHERE (SELECT COALESCE(SUM(julianday(end_d) - julianday(start_d) + 1), 0) FROM freeze
         WHERE member_no = NEW.member_no AND status = 'approved'
           AND strftime('%Y', start_d) = strftime('%Y', NEW.start_d))
        + (julianday(NEW.end_d) - julianday(NEW.start_d) + 1) > 45;
END;

CREATE TRIGGER freeze_change_checks
BEFORE UPDATE ON freeze
BEGIN
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: freeze_terms: freeze dates never change; a freeze can only be cancelled before it starts')
  WHERE NEW.member_no IS NOT OLD.member_no OR NEW.start_d IS NOT OLD.start_d OR NEW.end_d IS NOT OLD.end_d
     OR (NEW.status IS NOT OLD.status
         AND (OLD.status <> 'approved' OR OLD.start_d <= (SELECT d FROM gym_today)));
END;

CREATE TRIGGER freeze_after_new
AFTER INSERT ON freeze
BEGIN
  -- the member's booked classes during the freeze are cancelled (their places go to the waitlist)
  UPDATE booking SET status = 'cancelled'
  WHERE member_no = NEW.member_no AND status = 'booked'
    AND session_code IN (SELECT session_code FROM class_session WHERE day BETWEEN NEW.start_d AND NEW.end_d);
END;

-- ---------------------------------------------------------------- guests

CREATE TRIGGER guest_checks
BEFORE INSERT ON guest_visit
BEGIN
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: guest_monthly_cap: guests per calendar month: basic 0, offpeak 2, premium 4')
  WHERE (SELECT COUNT(*) FROM guest_visit
         WHERE member_no = NEW.member_no AND strftime('%Y-%m', visit_day) = strftime('%Y-%m', NEW.visit_day))
        >= (SELECT CASE plan WHEN 'premium' THEN 4 WHEN 'offpeak' THEN 2 ELSE 0 END
            FROM member WHERE member_no = NEW.member_no);
END;
